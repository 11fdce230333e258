/*
 * gpuipc_buf_export_foreign: memory gpuipc did not allocate. Small
 * cuMemAlloc allocations (what cudaMalloc makes) share 2 MiB blocks, and a
 * legacy handle would hand the whole block over: refused with
 * GPUIPC_E_WHOLEBLOCK unless the caller accepts it. Whole allocations go,
 * and another process reads and writes their bytes.
 */
#include "gpu_test.h"
#include "helpers/vmm_prop.h"

#include "mem/gpu.h"

#include <fcntl.h>

#if GPUIPC_HAVE_CUDA

#define BLOCK GPUIPC__LEGACY_BLOCK

static CUdeviceptr dev_alloc(size_t n)
{
  struct gpuipc__ctx_saved saved;
  ASSERT_OK(gpuipc__ctx_enter(0, &saved));
  CUdeviceptr p = 0;
  ASSERT_OK(GPUIPC_CU(cuMemAlloc, &p, n));
  gpuipc__ctx_leave(&saved);
  return p;
}

static void dev_free(CUdeviceptr p)
{
  struct gpuipc__ctx_saved saved;
  ASSERT_OK(gpuipc__ctx_enter(0, &saved));
  ASSERT_OK(GPUIPC_CU(cuMemFree, p));
  gpuipc__ctx_leave(&saved);
}

/* cuMemCreate memory mapped read-write on GPU 0, with @types handles. */
struct vmm_alloc {
  CUmemGenericAllocationHandle mh;
  CUdeviceptr va;
  size_t size;
};

static void vmm_create(struct vmm_alloc *v, size_t size,
                       CUmemAllocationHandleType types)
{
  CUmemAllocationProp prop;
  vmm_prop(0, types, &prop);
  struct gpuipc__ctx_saved saved;
  ASSERT_OK(gpuipc__ctx_enter(0, &saved));
  ASSERT_OK(GPUIPC_CU(cuMemCreate, &v->mh, size, &prop, 0));
  ASSERT_OK(GPUIPC_CU(cuMemAddressReserve, &v->va, size, 0, 0, 0));
  ASSERT_OK(GPUIPC_CU(cuMemMap, v->va, size, 0, v->mh, 0));
  CUmemAccessDesc a;
  memset(&a, 0, sizeof(a));
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = prop.location.id;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_OK(GPUIPC_CU(cuMemSetAccess, v->va, size, &a, 1));
  gpuipc__ctx_leave(&saved);
  v->size = size;
}

static void vmm_destroy(struct vmm_alloc *v)
{
  struct gpuipc__ctx_saved saved;
  ASSERT_OK(gpuipc__ctx_enter(0, &saved));
  ASSERT_OK(GPUIPC_CU(cuMemUnmap, v->va, v->size));
  ASSERT_OK(GPUIPC_CU(cuMemAddressFree, v->va, v->size));
  ASSERT_OK(GPUIPC_CU(cuMemRelease, v->mh));
  gpuipc__ctx_leave(&saved);
}

static void *P(CUdeviceptr p)
{
  return (void *)(uintptr_t)p;
}

int main(void)
{
  gpuipc_handle_t h;
  int x = 0;
  ASSERT_RC(gpuipc_buf_export_foreign(NULL, 1, 0, &h), -EINVAL);
  ASSERT_RC(gpuipc_buf_export_foreign(&x, 0, 0, &h), -EINVAL);
  ASSERT_RC(gpuipc_buf_export_foreign(&x, 1, 0, NULL), -EINVAL);
  ASSERT_RC(gpuipc_buf_export_foreign(&x, 1, 0x80, &h), -EINVAL);
  test_require_gpus(1);
  gpu_require_helper("gpu_peer");

  /* Host memory is not device memory. */
  ASSERT_RC(gpuipc_buf_export_foreign(&x, sizeof(x), 0, &h), -EINVAL);

  /* Two small allocations, as cudaMalloc makes them. */
  CUdeviceptr a = dev_alloc(1000), b = dev_alloc(1000);
  long long apart = (long long)b - (long long)a;
  bool shared = a / BLOCK == b / BLOCK;
  printf("two 1000-byte cuMemAllocs: 0x%llx and 0x%llx, %lld bytes apart, "
         "%s\n", (unsigned long long)a, (unsigned long long)b, apart,
         shared ? "in one 2 MiB block" : "in different blocks (NOTE: the "
                                         "driver did not pack them)");
  ASSERT_RC(gpuipc_buf_export_foreign(P(a), 1000, 0, &h), GPUIPC_E_WHOLEBLOCK);
  ASSERT_ERR_MENTIONS("2 MiB");
  printf("export_foreign(first, 1000): %s\n", gpuipc_last_error());
  ASSERT_OK(gpuipc_buf_export_foreign(P(a), 1000,
                                      GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK, &h));
  ASSERT_EQ(h.kind, GPUIPC_KIND_LEGACY);
  ASSERT_EQ(h.type, GPUIPC_HT_LEGACY);
  ASSERT_EQ_U(h.offset, 0);
  ASSERT_EQ_U(h.size, 1000);
  ASSERT_EQ(h.fd, -1);
  ASSERT_TRUE(h.export_id >> 63); /* apart from buffers' export ids */
  /* Past the end of the allocation. */
  ASSERT_RC(gpuipc_buf_export_foreign(P(a), 1001,
                                      GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK, &h),
            -EINVAL);
  dev_free(a);
  dev_free(b);

  /* A whole block of its own goes; a part of one only when accepted. */
  CUdeviceptr c = dev_alloc(BLOCK), d = dev_alloc(BLOCK);
  ASSERT_EQ_U(c % BLOCK, 0);
  gpu_fill_host(0, P(c), BLOCK, 600);
  gpu_fill_host(0, P(d + 8192), 4096, 610);
  gpuipc_handle_t whole, whole2, part, vm;
  ASSERT_OK(gpuipc_buf_export_foreign(P(c), BLOCK, 0, &whole));
  ASSERT_EQ(whole.kind, GPUIPC_KIND_LEGACY);
  /* The same block again: another export id, the same memory. */
  ASSERT_OK(gpuipc_buf_export_foreign(P(c), BLOCK, 0, &whole2));
  ASSERT_TRUE(whole2.export_id != whole.export_id);
  ASSERT_RC(gpuipc_buf_export_foreign(P(d + 8192), 4096, 0, &part),
            GPUIPC_E_WHOLEBLOCK);
  ASSERT_OK(gpuipc_buf_export_foreign(P(d + 8192), 4096,
                                      GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK, &part));
  ASSERT_EQ_U(part.offset, 8192);
  ASSERT_EQ_U(part.alloc_size, BLOCK);

  /* cuMemCreate memory goes by fd, whole only. */
  struct vmm_alloc v;
  vmm_create(&v, BLOCK, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  gpu_fill_host(0, P(v.va), BLOCK, 620);
  ASSERT_RC(gpuipc_buf_export_foreign(P(v.va + 4096), 4096, 0, &vm),
            GPUIPC_E_WHOLEBLOCK);
  ASSERT_OK(gpuipc_buf_export_foreign(P(v.va), BLOCK, 0, &vm));
  ASSERT_EQ(vm.kind, GPUIPC_KIND_VMM);
  ASSERT_EQ(vm.type, GPUIPC_HT_POSIX_FD);
  ASSERT_GE(vm.fd, 0);
  ASSERT_TRUE(fcntl(vm.fd, F_GETFD) & FD_CLOEXEC);

  /* Memory made without shareable handles cannot go. */
  struct vmm_alloc plain;
  vmm_create(&plain, BLOCK, CU_MEM_HANDLE_TYPE_NONE);
  ASSERT_RC(gpuipc_buf_export_foreign(P(plain.va), BLOCK, 0, &h),
            GPUIPC_E_UNSUPPORTED);
  vmm_destroy(&plain);
  /* Nor memory from a stream-ordered pool (its pool would go with it). */
  if (gpuipc_kind_available(GPUIPC_KIND_POOL) == 0) {
    gpuipc_buf_t *pb;
    ASSERT_OK(gpuipc_buf_alloc(BLOCK, GPUIPC_KIND_POOL, 0, 0, &pb));
    ASSERT_RC(gpuipc_buf_export_foreign(gpuipc_buf_ptr(pb), BLOCK, 0, &h),
              GPUIPC_E_UNSUPPORTED);
    printf("pool memory: %s\n", gpuipc_last_error());
    ASSERT_OK(gpuipc_buf_release(pb));
  }

  /*
   * Another process imports them in turn, checks the bytes and writes its
   * own from a kernel; this process reads them back. The two handles of
   * block c open it once there and show the bytes the first one wrote.
   */
  int sock;
  pid_t imp = gpu_start_importer(-1, NULL, &sock);
  proto_send_handle(sock, &whole, 600, 3);
  proto_send_handle(sock, &whole2, 601, 2);
  proto_send_handle(sock, &part, 610, 1);
  proto_send_handle(sock, &vm, 620, 0);
  close(vm.fd);
  ASSERT_EQ_U(proto_recv_word(sock, TAG_WRITTEN), 601);
  ASSERT_EQ_U(proto_recv_word(sock, TAG_WRITTEN), 602);
  ASSERT_EQ_U(proto_recv_word(sock, TAG_WRITTEN), 611);
  ASSERT_EQ_U(proto_recv_word(sock, TAG_WRITTEN), 621);
  gpu_expect(0, P(c), BLOCK, 602);
  gpu_expect(0, P(d + 8192), 4096, 611);
  gpu_expect(0, P(v.va), BLOCK, 621);
  proto_send_word(sock, TAG_DONE, 1);
  ASSERT_EQ(test_wait(imp, GPU_PROC_TIMEOUT_MS), 0);
  close(sock);
  printf("a foreign cuMemAlloc block (twice), a part of another and a "
         "cuMemCreate allocation crossed both ways\n");
  vmm_destroy(&v);
  dev_free(c);
  dev_free(d);
  return 0;
}

#else
GPU_TEST_NEEDS_CUDA_HEADER()
#endif
