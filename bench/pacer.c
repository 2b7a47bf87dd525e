/*
 * The paced (open-loop) load generator of bench/harness.py's commit-1-half scenario, in C: at the
 * rates where a durable server's p99 is measured, the Python generator's own p99 (the librdkafka mock's,
 * measured at the same rate) was ~2 ms, several times the target being measured. This one keeps the
 * same rules as bench/client.py's Pacer: request k is due at t0 + k / rate and dealt round robin to the
 * connections; a connection sends its due requests while fewer than `inflight` are outstanding; a
 * request's latency runs from when it was due, so a server that falls behind is not flattered.
 *
 * It only sends and times: frames come pre-encoded from the harness (correlation id = ring index) and
 * the answers are checked by the harness afterwards from what this writes: the first body answered for
 * each distinct request, and every later body that differs from it.
 *
 * Usage: pacer HOST PORT CONNECTIONS INFLIGHT RATE WARMUP_S DURATION_S RING_FILE OUT_DIR
 * RING_FILE: u32 ring length, u32 distinct requests, then per ring position u32 request, u32 frame
 * length, the frame (size prefix included); integers little-endian.
 * Writes OUT_DIR/latencies.f64 (seconds, measured window), OUT_DIR/bodies.bin and OUT_DIR/odd.bin
 * (u32 request, u32 length, body); prints "window-start" and "window-end" when the measured window
 * opens and closes, then one JSON line of counters. Loopback only: it connects where it is told.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define TICK_NS 100000L      /* pacing pass every 0.1 ms */
#define DRAIN_S 10.0         /* after the window: how long to wait for outstanding answers */
#define MAX_ODD 10000        /* differing bodies written out at most */

typedef struct {
    int fd, index;
    uint64_t start;          /* ring position of this connection's first request */
    uint64_t dealt, sent, received;
    uint64_t held_upto;      /* requests before this one were already counted as held by the in-flight cap */
    char *out; size_t out_len, out_cap;
    char *in; size_t in_len, in_cap;
} conn_t;

static uint32_t ring_len, distinct;
static uint32_t *slot_of;
static char **frames; static uint32_t *frame_len;
static char **first_body; static uint32_t *first_len;
static double t0, rate;
static int nconn, inflight;
static conn_t *conns;
static double *lat; static size_t lat_len, lat_cap;
static uint64_t window_responses, late, held, out_of_order, odd_count, lost;
static int recording, stopping;
static FILE *odd_file;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what) { perror(what); exit(2); }

static uint32_t be32(const char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return ntohl(v);
}

static void *grow(void *p, size_t *cap, size_t need, size_t unit) {
    if (need <= *cap) return p;
    size_t cap2 = *cap ? *cap : 4096;
    while (cap2 < need) cap2 *= 2;
    p = realloc(p, cap2 * unit);
    if (!p) die("realloc");
    *cap = cap2;
    return p;
}

static void read_ring(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    if (fread(&ring_len, 4, 1, f) != 1 || fread(&distinct, 4, 1, f) != 1) die("ring header");
    slot_of = calloc(ring_len, 4); frames = calloc(ring_len, sizeof(char *)); frame_len = calloc(ring_len, 4);
    first_body = calloc(distinct, sizeof(char *)); first_len = calloc(distinct, 4);
    for (uint32_t i = 0; i < ring_len; i++) {
        if (fread(&slot_of[i], 4, 1, f) != 1 || fread(&frame_len[i], 4, 1, f) != 1) die("ring entry");
        if (slot_of[i] >= distinct) { fprintf(stderr, "ring entry %u: bad request %u\n", i, slot_of[i]); exit(2); }
        frames[i] = malloc(frame_len[i]);
        if (fread(frames[i], 1, frame_len[i], f) != frame_len[i]) die("ring frame");
    }
    fclose(f);
}

static void flush_out(conn_t *c) {
    while (c->out_len) {
        ssize_t n = write(c->fd, c->out, c->out_len);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            lost++; c->out_len = 0; return;
        }
        memmove(c->out, c->out + n, c->out_len - n);
        c->out_len -= n;
    }
}

static void pump(conn_t *c, double now) {
    while (!stopping && c->sent < c->dealt && c->sent - c->received < (uint64_t)inflight) {
        uint64_t k = c->sent * nconn + c->index;           /* global request number */
        if (recording && now - (t0 + k / rate) > 2e-9 * TICK_NS) late++;
        uint32_t pos = (uint32_t)((c->start + c->sent) % ring_len);
        c->out = grow(c->out, &c->out_cap, c->out_len + frame_len[pos], 1);
        memcpy(c->out + c->out_len, frames[pos], frame_len[pos]);
        c->out_len += frame_len[pos];
        c->sent++;
    }
    /* Due requests left unsent here wait for answers: count each once (measured window only), so the
       report can tell waiting behind the server from the pacer's own tick. */
    if (!stopping && c->sent < c->dealt) {
        uint64_t from = c->held_upto > c->sent ? c->held_upto : c->sent;
        if (recording && c->dealt > from) held += c->dealt - from;
        c->held_upto = c->dealt;
    }
    flush_out(c);
}

static void answer(conn_t *c, const char *frame, uint32_t size, double now) {
    uint32_t pos = (uint32_t)((c->start + c->received) % ring_len);
    uint64_t k = c->received * nconn + c->index;
    c->received++;
    if (size < 4 || be32(frame) != pos) { out_of_order++; return; }
    uint32_t slot = slot_of[pos], blen = size - 4;
    const char *body = frame + 4;
    if (!first_body[slot]) {
        first_body[slot] = malloc(blen ? blen : 1); memcpy(first_body[slot], body, blen); first_len[slot] = blen;
    } else if (first_len[slot] != blen || memcmp(first_body[slot], body, blen) != 0) {
        if (odd_count++ < MAX_ODD) { fwrite(&slot, 4, 1, odd_file); fwrite(&blen, 4, 1, odd_file); fwrite(body, 1, blen, odd_file); }
    }
    if (recording) {
        window_responses++;
        lat = grow(lat, &lat_cap, lat_len + 1, sizeof(double));
        lat[lat_len++] = now - (t0 + k / rate);
    }
}

static void readable(conn_t *c, double now) {
    for (;;) {
        c->in = grow(c->in, &c->in_cap, c->in_len + 65536, 1);
        ssize_t n = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
        if (n < 0) { if (errno == EAGAIN || errno == EINTR) break; lost++; return; }
        if (n == 0) { lost++; close(c->fd); c->fd = -1; return; }
        c->in_len += n;
        if ((size_t)n < 65536) break;
    }
    size_t pos = 0;
    while (c->in_len - pos >= 4) {
        uint32_t size = be32(c->in + pos);
        if (c->in_len - pos - 4 < size) break;
        answer(c, c->in + pos + 4, size, now);
        pos += 4 + size;
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
    pump(c, now);
}

static void write_file(const char *dir, const char *name, const void *data, size_t len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len) die(path);
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 10) {
        fprintf(stderr, "usage: %s HOST PORT CONNECTIONS INFLIGHT RATE WARMUP_S DURATION_S RING_FILE OUT_DIR\n", argv[0]);
        return 2;
    }
    const char *host = argv[1], *outdir = argv[9];
    int port = atoi(argv[2]);
    nconn = atoi(argv[3]); inflight = atoi(argv[4]); rate = atof(argv[5]);
    double warmup = atof(argv[6]), duration = atof(argv[7]);
    if (nconn < 1 || inflight < 1 || rate <= 0) { fprintf(stderr, "bad arguments\n"); return 2; }
    read_ring(argv[8]);
    char path[4096];
    snprintf(path, sizeof path, "%s/odd.bin", outdir);
    if (!(odd_file = fopen(path, "wb"))) die(path);

    int ep = epoll_create1(0);
    conns = calloc(nconn, sizeof(conn_t));
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) { fprintf(stderr, "bad host %s\n", host); return 2; }
    for (int i = 0; i < nconn; i++) {
        conn_t *c = &conns[i];
        c->index = i;
        c->start = (uint64_t)i * inflight;  /* as bench/client.py: connections start on different groups */
        if ((c->fd = socket(AF_INET, SOCK_STREAM, 0)) < 0) die("socket");
        if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0) die("connect");
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.u32 = (uint32_t)i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) < 0) die("epoll_ctl");
    }
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct itimerspec its = {.it_interval = {0, TICK_NS}, .it_value = {0, TICK_NS}};
    timerfd_settime(tfd, 0, &its, NULL);
    struct epoll_event tev = {.events = EPOLLIN, .data.u32 = 0xffffffffu};
    epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &tev);

    t0 = now_s();
    double window_start = t0 + warmup, window_end = window_start + duration, drain_end = 0, started = 0;
    struct rusage ru0 = {0};
    uint64_t issued = 0;
    struct epoll_event events[64];
    for (;;) {
        int n = epoll_wait(ep, events, 64, 10);
        double now = now_s();
        if (!recording && !stopping && now >= window_start) {
            recording = 1; started = now; getrusage(RUSAGE_SELF, &ru0);
            printf("window-start\n"); fflush(stdout);
        }
        if (recording && now >= window_end) {
            recording = 0; stopping = 1; drain_end = now + DRAIN_S;
            struct rusage ru1; getrusage(RUSAGE_SELF, &ru1);
            double cpu = (ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) + (ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e6
                       + (ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) + (ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
            printf("window-end %.6f %.6f\n", now - started, cpu); fflush(stdout);
        }
        for (int i = 0; i < n; i++) {
            if (events[i].data.u32 == 0xffffffffu) {
                uint64_t ticks;
                if (read(tfd, &ticks, sizeof ticks) < 0 && errno != EAGAIN) die("timerfd");
                if (stopping) continue;
                uint64_t due = (uint64_t)((now - t0) * rate) + 1;  /* requests 0..k with t0 + k / rate <= now */
                for (; issued < due; issued++) conns[issued % nconn].dealt++;
                for (int j = 0; j < nconn; j++) if (conns[j].fd >= 0) pump(&conns[j], now);
                continue;
            }
            conn_t *c = &conns[events[i].data.u32];
            if (c->fd < 0) continue;
            if (events[i].events & EPOLLOUT) flush_out(c);
            if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) readable(c, now);
        }
        if (stopping) {
            uint64_t outstanding = 0, answered = 0;
            for (int j = 0; j < nconn; j++) {
                answered += conns[j].received;
                if (conns[j].fd >= 0) outstanding += conns[j].sent - conns[j].received;
            }
            if (outstanding == 0 || now >= drain_end || lost) {
                fclose(odd_file);
                write_file(outdir, "latencies.f64", lat, lat_len * sizeof(double));
                snprintf(path, sizeof path, "%s/bodies.bin", outdir);
                FILE *f = fopen(path, "wb");
                if (!f) die(path);
                for (uint32_t s = 0; s < distinct; s++) {
                    if (!first_body[s]) continue;
                    fwrite(&s, 4, 1, f); fwrite(&first_len[s], 4, 1, f); fwrite(first_body[s], 1, first_len[s], f);
                }
                fclose(f);
                printf("{\"responses\": %llu, \"answered\": %llu, \"late\": %llu, \"held\": %llu, "
                       "\"unanswered\": %llu, \"out_of_order\": %llu, \"odd\": %llu, \"lost_connections\": %llu}\n",
                       (unsigned long long)window_responses, (unsigned long long)answered, (unsigned long long)late,
                       (unsigned long long)held,
                       (unsigned long long)outstanding, (unsigned long long)out_of_order,
                       (unsigned long long)odd_count, (unsigned long long)lost);
                return 0;
            }
        }
    }
}
