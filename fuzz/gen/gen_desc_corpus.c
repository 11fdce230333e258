/*
 * Writes the seed corpus of fuzz/fuzz_desc into DIR: valid descriptors
 * (1 to 8 dimensions, row-major, column-major, negative strides, empty,
 * with an event handle, with flags), release records (a word written on
 * another GPU among them), and block lists of
 * either form.
 *
 * Not part of the build (every .c file directly under fuzz/ is a libFuzzer
 * target). From the repository root:
 *   cc -std=gnu11 -D_GNU_SOURCE -Iinclude -Isrc -o /tmp/gen_desc_corpus \
 *     fuzz/gen/gen_desc_corpus.c src/wire/[a-z]*.c \
 *     src/core/[a-z]*.c -lpthread
 *   /tmp/gen_desc_corpus fuzz/corpus/fuzz_desc
 * (desc.c calls gpuipc_handle_pack/unpack from src/wire.) Deterministic.
 */
#include "wire/desc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dir;

static void put(const char *name, const void *p, int n)
{
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (n <= 0 || f == NULL || fwrite(p, 1, (size_t)n, f) != (size_t)n ||
      fclose(f) != 0) {
    fprintf(stderr, "writing %s failed\n", path);
    exit(1);
  }
}

static void desc(const char *name, struct gpuipc__desc *d)
{
  uint8_t b[GPUIPC__CHAN_DESC_BYTES];
  struct gpuipc__desc chk;
  int n = gpuipc__desc_encode(d, b, sizeof(b));
  if (gpuipc__desc_decode(b, (size_t)n, &chk, "gen") != 0) {
    fprintf(stderr, "%s: %s\n", name, gpuipc_last_error());
    exit(1);
  }
  put(name, b, n);
}

static void blist(const char *name, const uint8_t *p, size_t n, uint64_t seq)
{
  struct gpuipc__blist l;
  if (gpuipc__blist_decode(p, n, seq, &l, "gen") != 0) {
    fprintf(stderr, "%s: %s\n", name, gpuipc_last_error());
    exit(1);
  }
  gpuipc__blist_free(&l);
  put(name, p, (int)n);
}

int main(int argc, char **argv)
{
  if (argc != 2) {
    fprintf(stderr, "usage: gen_desc_corpus DIR\n");
    return 2;
  }
  dir = argv[1];
  struct gpuipc__desc d;
  memset(&d, 0, sizeof(d));
  d.type = GPUIPC__DESC_TENSOR;
  d.seq = 1;
  d.buf_key = 1;
  d.buf_size = 4096;
  d.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_UINT, 8, 1};
  d.ndim = 1;
  d.shape[0] = 100;
  d.strides[0] = 1;
  desc("valid-1d-u8", &d);
  d.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_FLOAT, 32, 1};
  d.ndim = 2;
  d.shape[0] = 4;
  d.shape[1] = 8;
  d.strides[0] = 8;
  d.strides[1] = 1;
  d.offset = 256;
  desc("valid-2d-f32", &d);
  d.strides[0] = 1;
  d.strides[1] = 4;
  desc("valid-2d-colmajor", &d);
  d.strides[0] = -8;
  d.strides[1] = 1;
  d.offset = 3 * 8 * 4;
  desc("valid-2d-negative", &d);
  d.ndim = 8;
  d.offset = 0;
  for (int i = 0; i < 8; i++)
    d.shape[i] = 2;
  for (int i = 7, s = 1; i >= 0; i--, s *= 2)
    d.strides[i] = s;
  d.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_COMPLEX, 64, 1};
  desc("valid-8d-c64", &d);
  d.shape[3] = 0;
  desc("valid-empty", &d);
  d.ndim = 0;
  d.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_BFLOAT, 16, 4};
  d.flags = GPUIPC__DESC_EVENT | GPUIPC__DESC_NEW_EVENT |
            GPUIPC__DESC_NEW_BUF | GPUIPC__DESC_FORGET;
  d.forget_key = 7;
  d.ev_key = 1025;
  memset(d.ev_handle, 0x42, sizeof(d.ev_handle));
  desc("valid-scalar-flags", &d);

  struct gpuipc__rel r;
  memset(&r, 0, sizeof(r));
  r.seq = 9;
  uint8_t b[GPUIPC__CHAN_REL_BYTES];
  put("valid-release", b, gpuipc__rel_encode(&r, b, sizeof(b)));
  r.flags = GPUIPC__REL_EVENT | GPUIPC__REL_NEW_EVENT;
  r.ev_key = 3;
  memset(r.ev_handle, 0x17, sizeof(r.ev_handle));
  put("valid-release-event", b, gpuipc__rel_encode(&r, b, sizeof(b)));
  memset(&r, 0, sizeof(r));
  r.flags = GPUIPC__REL_WORD;
  r.seq = 10;
  put("valid-release-word", b, gpuipc__rel_encode(&r, b, sizeof(b)));
  r.flags = GPUIPC__REL_WORD | GPUIPC__REL_AWAY;
  put("valid-release-word-away", b, gpuipc__rel_encode(&r, b, sizeof(b)));
  /* Block lists: the full form (two buffers, three blocks) and the
   * slots form (one buffer, four slots). */
  struct gpuipc__blist_buf bufs[2] = {{.key = 3, .size = 1 << 20},
                                      {.key = 4, .size = 65536,
                                       .flags = GPUIPC__BLIST_NEW}};
  uint8_t l[4096];
  struct gpuipc__blist_block bl[3] = {
      {0, 0, 4096}, {1, 512, 100}, {0, 65536, 16384}};
  gpuipc__blist_put_head(l, 9, 2, 3, bufs);
  for (uint32_t i = 0; i < 3; i++)
    gpuipc__blist_put_block(l, 2, i, &bl[i]);
  blist("valid-blocks-full", l, gpuipc__blist_bytes(2, 3), 9);
  gpuipc__blist_put_slots_head(l, 10, 4, bufs, 16384);
  for (uint32_t i = 0; i < 4; i++)
    gpuipc__blist_put_slot(l, i, 63 - 7 * i);
  blist("valid-blocks-slots", l, gpuipc__blist_slots_bytes(4), 10);
  return 0;
}
