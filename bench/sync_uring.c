/* The flush cycle's hand-off without Python: is io_uring a cheaper way than the sync helper process?

   Each cycle writes 200 bytes in place into a preallocated 1 MiB file (as the journal overwrites its
   reused segments) and waits for its fdatasync, one cycle in flight, in a closed loop:

     inline  the fdatasync made by the loop itself;
     helper  sent to a child process over a SOCK_SEQPACKET socketpair with the descriptor passed in each
             message (SCM_RIGHTS), answered with an errno and the call's seconds, the answer waited for
             in epoll: what storage/synchelper.py does, with C on both sides;
     uring   an IORING_OP_FSYNC (IORING_FSYNC_DATASYNC) submitted to an io_uring whose completions signal
             an eventfd, waited for in epoll: what an event loop would add as one more reader.

   BUSY_US (optional) keeps the loop busy for that long after posting each sync, as a saturated server's
   loop is while the disk syncs. Reported: cycles/s, the cycle's p50/p99, CPU per cycle (the process's
   threads, io_uring's workers included, and the reaped helper's).

     cc -O2 -o sync_uring bench/sync_uring.c && ./sync_uring MODE CYCLES FILE [BUSY_US]

   Linux only (io_uring since 5.1; the kernel's io_uring_disabled sysctl must allow it). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FILE_BYTES (1 << 20)
#define WRITE_BYTES 200

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double seconds(struct timeval t) { return t.tv_sec + t.tv_usec / 1e6; }

static double cpu(void) {
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    return seconds(self.ru_utime) + seconds(self.ru_stime) + seconds(kids.ru_utime) + seconds(kids.ru_stime);
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void spin(double us) {
    double end = now() + us / 1e6;
    while (now() < end) {
    }
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* ---- helper: a child process syncing the descriptor each message carries ---- */

/* Room for one descriptor's control message, aligned as a cmsghdr must be. */
union control {
    char bytes[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
};

static void helper_main(int sock) {
    for (;;) {
        char op;
        union control control;
        struct iovec io = {&op, 1};
        struct msghdr msg = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = control.bytes,
                             .msg_controllen = sizeof control.bytes};
        if (recvmsg(sock, &msg, 0) <= 0) _exit(0);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        if (c == NULL || c->cmsg_type != SCM_RIGHTS) _exit(1);
        int fd;
        memcpy(&fd, CMSG_DATA(c), sizeof fd);
        double started = now();
        struct __attribute__((packed)) { int32_t error; double seconds; } reply = {fdatasync(fd) ? errno : 0, 0};
        reply.seconds = now() - started;
        close(fd);
        if (send(sock, &reply, sizeof reply, 0) != (ssize_t)sizeof reply) _exit(1);
    }
}

static void helper_post(int sock, int fd) {
    char op = 3;
    union control control;
    memset(&control, 0, sizeof control);
    struct iovec io = {&op, 1};
    struct msghdr msg = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = control.bytes,
                         .msg_controllen = sizeof control.bytes};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    if (sendmsg(sock, &msg, 0) != 1) die("sendmsg");
}

/* ---- uring: one submission queue entry per cycle, completions through an eventfd ---- */

struct ring {
    int fd;
    _Atomic unsigned *sq_tail, *cq_head, *cq_tail;
    unsigned *sq_mask, *sq_array, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
};

static void *map(int fd, size_t bytes, off_t what) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, what);
    if (p == MAP_FAILED) die("mmap");
    return p;
}

static void ring_open(struct ring *r, int eventfd_fd) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    r->fd = (int)syscall(__NR_io_uring_setup, 8, &p);
    if (r->fd < 0) die("io_uring_setup");
    size_t sq_bytes = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_bytes = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    char *sq, *cq;
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        sq = cq = map(r->fd, sq_bytes > cq_bytes ? sq_bytes : cq_bytes, IORING_OFF_SQ_RING);
    } else {
        sq = map(r->fd, sq_bytes, IORING_OFF_SQ_RING);
        cq = map(r->fd, cq_bytes, IORING_OFF_CQ_RING);
    }
    r->sqes = map(r->fd, p.sq_entries * sizeof(struct io_uring_sqe), IORING_OFF_SQES);
    r->sq_tail = (_Atomic unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->cq_head = (_Atomic unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (_Atomic unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    if (syscall(__NR_io_uring_register, r->fd, IORING_REGISTER_EVENTFD, &eventfd_fd, 1) < 0) die("io_uring_register");
}

static void ring_post_fdatasync(struct ring *r, int fd) {
    unsigned tail = atomic_load_explicit(r->sq_tail, memory_order_relaxed), slot = tail & *r->sq_mask;
    struct io_uring_sqe *sqe = &r->sqes[slot];
    memset(sqe, 0, sizeof *sqe);
    sqe->opcode = IORING_OP_FSYNC;
    sqe->fd = fd;
    sqe->fsync_flags = IORING_FSYNC_DATASYNC;
    r->sq_array[slot] = slot;
    atomic_store_explicit(r->sq_tail, tail + 1, memory_order_release);
    if (syscall(__NR_io_uring_enter, r->fd, 1, 0, 0, NULL, 0) != 1) die("io_uring_enter");
}

static void ring_reap(struct ring *r) {
    unsigned head = atomic_load_explicit(r->cq_head, memory_order_relaxed);
    while (head != atomic_load_explicit(r->cq_tail, memory_order_acquire)) {
        int res = r->cqes[head & *r->cq_mask].res;
        if (res < 0) {
            fprintf(stderr, "fdatasync: %s\n", strerror(-res));
            exit(1);
        }
        head++;
    }
    atomic_store_explicit(r->cq_head, head, memory_order_release);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s inline|helper|uring CYCLES FILE [BUSY_US]\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    int cycles = atoi(argv[2]);
    double busy_us = argc > 4 ? atof(argv[4]) : 0;
    int inline_sync = !strcmp(mode, "inline"), by_helper = !strcmp(mode, "helper"), by_uring = !strcmp(mode, "uring");
    if (cycles <= 0 || !(inline_sync || by_helper || by_uring)) {
        fprintf(stderr, "MODE is inline, helper or uring; CYCLES a positive number\n");
        return 2;
    }

    int fd = open(argv[3], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die("open");
    static char zeros[FILE_BYTES], record[WRITE_BYTES];
    memset(record, 'x', sizeof record);
    if (write(fd, zeros, sizeof zeros) != (ssize_t)sizeof zeros || fsync(fd)) die("preallocating");

    int ep = epoll_create1(0), sock = -1, efd = -1;
    pid_t child = 0;
    struct ring ring = {0};
    struct epoll_event ev = {.events = EPOLLIN}, ready;
    if (by_helper) {
        int pair[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, pair)) die("socketpair");
        child = fork();
        if (child == 0) {
            close(pair[0]);
            helper_main(pair[1]);
        }
        close(pair[1]);
        sock = pair[0];
        ev.data.fd = sock;
    } else if (by_uring) {
        efd = eventfd(0, EFD_NONBLOCK);
        ring_open(&ring, efd);
        ev.data.fd = efd;
    }
    if (!inline_sync && epoll_ctl(ep, EPOLL_CTL_ADD, ev.data.fd, &ev)) die("epoll_ctl");

    double *latency = malloc(cycles * sizeof(double));
    if (latency == NULL) die("malloc");
    double cpu_before = cpu(), started = now();
    for (int i = 0; i < cycles; i++) {
        double cycle_start = now();
        off_t at = (off_t)(i % (FILE_BYTES / WRITE_BYTES)) * WRITE_BYTES;  /* always inside the file: in place */
        if (pwrite(fd, record, sizeof record, at) != WRITE_BYTES) die("pwrite");
        if (inline_sync) {
            if (fdatasync(fd)) die("fdatasync");
            if (busy_us > 0) spin(busy_us);
        } else {
            if (by_helper) helper_post(sock, fd);
            else ring_post_fdatasync(&ring, fd);
            if (busy_us > 0) spin(busy_us);
            if (epoll_wait(ep, &ready, 1, -1) != 1) die("epoll_wait");
            if (by_helper) {
                char reply[64];
                int32_t error;
                if (recv(sock, reply, sizeof reply, 0) != 12) die("the helper's answer");
                memcpy(&error, reply, sizeof error);
                if (error) {
                    errno = error;
                    die("the helper's fdatasync");
                }
            } else {
                uint64_t signalled;
                if (read(efd, &signalled, sizeof signalled) != sizeof signalled) die("eventfd");
                ring_reap(&ring);
            }
        }
        latency[i] = now() - cycle_start;
    }
    double elapsed = now() - started;
    if (by_helper) {
        close(sock);
        waitpid(child, NULL, 0);
    }
    double per_cycle_us = (cpu() - cpu_before) / cycles * 1e6;
    qsort(latency, cycles, sizeof(double), by_value);
    printf("%-6s busy %4.0f us: %7.0f cycles/s, p50 %7.1f us, p99 %7.1f us, CPU %6.1f us per cycle (%6.1f besides the busy time)\n",
           mode, busy_us, cycles / elapsed, latency[cycles / 2] * 1e6, latency[(long)cycles * 99 / 100] * 1e6,
           per_cycle_us, per_cycle_us - busy_us);
    free(latency);
    return 0;
}
