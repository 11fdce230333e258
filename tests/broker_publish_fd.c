/*
 * The broker checks the descriptor a PUBLISH brings before it stores it:
 * a HOST segment's must be a memfd sealed as gpuipc seals its own and as
 * large as its handle says, a VMM segment's one of the NVIDIA driver's.
 * Anything else -- a pipe, a socket, a directory, an epoll or event
 * descriptor, a device, a file on disk, an unsealed, half-sealed or too
 * small memfd -- is refused with GPUIPC_E_BADHANDLE and a sentence, and the
 * name reserved for it is free again: a member waiting to create it gets
 * it at once. A sound memfd is still taken, and opens.
 */
#include "test.h"
#include "helpers/raw_proto.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>

#define SIZE 8192
/* The seals gpuipc puts on its memfds. */
#define ALL_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static gpuipc_domain_t *dom;

static int state_of(const char *name)
{
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  int rc = gpuipc_segment_stat(dom, name, &s);
  return rc == 0 ? (int)s.state : rc;
}

static int memfd(size_t size, unsigned seals)
{
  int fd = memfd_create("bad", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, (off_t)size), 0);
  if (seals != 0)
    ASSERT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
  return fd;
}

static int other_end(int fds[2])
{
  close(fds[1]);
  return fds[0];
}

static int disk_file(void)
{
  char path[512];
  snprintf(path, sizeof(path), "%s/disk-XXXXXX", getenv("GPUIPC_DIR"));
  int fd = mkostemp(path, O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(unlink(path), 0);
  ASSERT_EQ(ftruncate(fd, SIZE), 0);
  return fd;
}

/* OPEN @name with CREATE without reading the answer. */
static void open_send(int fd, const char *name)
{
  struct gpuipc__msg m;
  raw_open_msg(&m, 7, name, GPUIPC_CREATE, 0, SIZE, 20000);
  raw_send(fd, &m, NULL, 0);
}

/*
 * Reserve @name on @pub, have @waiter ask to create it too, publish @bad
 * there as a @kind segment: refused, and the waiter gets the name.
 */
static void refused(int pub, int waiter, const char *name, uint8_t kind,
                    const char *what, int bad)
{
  struct gpuipc__msg r;
  ASSERT_EQ(raw_open(pub, name, GPUIPC_CREATE, kind, SIZE, &r),
            GPUIPC_MSG_CREATE_IT);
  uint64_t id = r.u.create_it.id;
  open_send(waiter, name); /* parked: the name is being created */
  struct gpuipc__seg_wire w = raw_fd_seg(name, id, kind, SIZE, SIZE);
  uint16_t type = raw_publish(pub, &w, bad, &r);
  close(bad);
  if (type != GPUIPC_MSG_ERROR)
    TFAIL("%s: the broker took it (%s)", what, gpuipc__msg_name(type));
  ASSERT_EQ(r.u.error.code, GPUIPC_E_BADHANDLE);
  printf("%-22s %s\n", what, r.u.error.text);
  raw_expect(waiter, &r, GPUIPC_MSG_CREATE_IT);
  ASSERT_EQ(state_of(name), GPUIPC_SEG_CREATING);
  struct gpuipc__msg ab = {.type = GPUIPC_MSG_ABANDON};
  ab.u.abandon.id = r.u.create_it.id;
  raw_send(waiter, &ab, NULL, 0);
  for (int tries = 0; tries < 3000 && state_of(name) != -ENOENT; tries++)
    usleep(1000);
  ASSERT_EQ(state_of(name), -ENOENT);
}

int main(void)
{
  ASSERT_OK(gpuipc_domain_join("pfd", NULL, &dom));
  int pub = raw_connect("pfd"), waiter = raw_connect("pfd");
  raw_hello(pub);
  raw_hello(waiter);

  int p[2], sv[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  refused(pub, waiter, "pipe", GPUIPC_KIND_HOST, "a pipe", other_end(p));
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  refused(pub, waiter, "sock", GPUIPC_KIND_HOST, "a socket", other_end(sv));
  refused(pub, waiter, "dir", GPUIPC_KIND_HOST, "a directory",
          open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  refused(pub, waiter, "epoll", GPUIPC_KIND_HOST, "an epoll descriptor",
          epoll_create1(EPOLL_CLOEXEC));
  refused(pub, waiter, "event", GPUIPC_KIND_HOST, "an eventfd",
          eventfd(0, EFD_CLOEXEC));
  refused(pub, waiter, "null", GPUIPC_KIND_HOST, "/dev/null",
          open("/dev/null", O_RDWR | O_CLOEXEC));
  refused(pub, waiter, "disk", GPUIPC_KIND_HOST, "a file on disk",
          disk_file());
  refused(pub, waiter, "unsealed", GPUIPC_KIND_HOST, "an unsealed memfd",
          memfd(SIZE, 0));
  refused(pub, waiter, "halfsealed", GPUIPC_KIND_HOST,
          "a memfd that may grow", memfd(SIZE, F_SEAL_SHRINK));
  refused(pub, waiter, "small", GPUIPC_KIND_HOST, "a too small memfd",
          memfd(SIZE / 2, ALL_SEALS));
  refused(pub, waiter, "vmmmemfd", GPUIPC_KIND_VMM, "VMM: a memfd",
          memfd(SIZE, ALL_SEALS));
  refused(pub, waiter, "vmmnull", GPUIPC_KIND_VMM, "VMM: /dev/null",
          open("/dev/null", O_RDWR | O_CLOEXEC));

  /* Without a reservation (the broker changed since): refused as well. */
  struct gpuipc__msg r;
  struct gpuipc__seg_wire w = raw_fd_seg("norsv", 42, GPUIPC_KIND_HOST, SIZE,
                                         SIZE);
  int bad = memfd(SIZE, 0);
  ASSERT_EQ(raw_publish(pub, &w, bad, &r), GPUIPC_MSG_ERROR);
  close(bad);
  ASSERT_EQ(r.u.error.code, GPUIPC_E_BADHANDLE);
  ASSERT_EQ(state_of("norsv"), -ENOENT);

  /* A memfd as gpuipc makes them is taken, and opens with its bytes. */
  ASSERT_EQ(raw_open(pub, "good", GPUIPC_CREATE, GPUIPC_KIND_HOST, SIZE, &r),
            GPUIPC_MSG_CREATE_IT);
  w = raw_fd_seg("good", r.u.create_it.id, GPUIPC_KIND_HOST, SIZE, SIZE);
  int good;
  ASSERT_OK(gpuipc__memfd_create("good", SIZE, &good));
  ASSERT_EQ(pwrite(good, "gpuipc", 6, 0), 6);
  ASSERT_EQ(raw_publish(pub, &w, good, &r), GPUIPC_MSG_OK);
  close(good);
  gpuipc_buf_t *b;
  ASSERT_OK(test_seg_open(dom, "good", SIZE, -1, 0, &b));
  ASSERT_EQ(memcmp(gpuipc_buf_ptr(b), "gpuipc", 6), 0);
  ASSERT_OK(gpuipc_buf_release(b));

  /* The refused names work as any other. */
  ASSERT_OK(test_seg_open(dom, "pipe", SIZE, -1, GPUIPC_CREATE, &b));
  ASSERT_EQ(state_of("pipe"), GPUIPC_SEG_PUBLISHED);
  ASSERT_OK(gpuipc_buf_release(b));
  close(pub);
  close(waiter);
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("broker_publish_fd: ok\n");
  return 0;
}
