/*
 * connclient.c - connection-storm load generator (single thread, epoll).
 *
 * Usage: connclient HOST PORT INFLIGHT SECONDS MODE [FRAMEFILE] [SRC_BASE]
 *
 * Keeps INFLIGHT non-blocking connections in progress.  A connection is
 * "completed" when
 *   MODE fin: the server closes it (read returns 0 or ECONNRESET);
 *   MODE req: FRAMEFILE's frame was sent and one full size-prefixed response
 *             came back (then the client closes).
 * A new connection starts as soon as one completes or fails.  Each socket is
 * bound to a rotating source address 127.0.0.X (X = SRC_BASE..SRC_BASE+99,
 * default base 2) with IP_BIND_ADDRESS_NO_PORT, so the ephemeral port is
 * picked at connect() time per 4-tuple: no TIME_WAIT / port exhaustion.
 * Per-connection timeout 5 s (error).  Prints one JSON line, exits 0.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif
#define TIMEOUT_S 5.0
#define NSRC 100

enum { FREE, CONNECTING, WAITING };

struct slot {
    int fd, state;
    double started;
    size_t sent;                /* req mode: bytes of the frame written */
    size_t got;                 /* req mode: response bytes read so far */
    size_t need;                /* req mode: total response length once known */
    unsigned char hdr[4];
};

static int epfd, req_mode, src_base = 2, src_next;
static unsigned char *frame;
static size_t flen;
static struct sockaddr_in dst;
static long completed, errors;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void finish(struct slot *s, int ok) {
    close(s->fd);
    s->state = FREE;
    if (ok) completed++; else errors++;
}

/* Start a new connection in a free slot. */
static void start(struct slot *s, double t) {
    memset(s, 0, sizeof *s);
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (s->fd < 0) { errors++; return; }        /* slot stays FREE; retried later */
    int one = 1;
    setsockopt(s->fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    struct sockaddr_in src = { .sin_family = AF_INET };
    src.sin_addr.s_addr = htonl(0x7f000000u | (uint32_t)(src_base + src_next));
    src_next = (src_next + 1) % NSRC;
    if (bind(s->fd, (struct sockaddr *)&src, sizeof src) < 0 ||
        (connect(s->fd, (struct sockaddr *)&dst, sizeof dst) < 0 && errno != EINPROGRESS)) {
        close(s->fd); errors++; return;
    }
    s->state = CONNECTING;
    s->started = t;
    struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT, .data.ptr = s };
    epoll_ctl(epfd, EPOLL_CTL_ADD, s->fd, &ev);
}

/* Send (the rest of) the request frame; returns -1 on error. */
static int send_req(struct slot *s) {
    ssize_t n = write(s->fd, frame + s->sent, flen - s->sent);
    if (n < 0) return (errno == EAGAIN || errno == EINTR) ? 0 : -1;
    s->sent += n;
    return 0;
}

static void set_events(struct slot *s) {
    struct epoll_event ev = { .events = EPOLLIN | (req_mode && s->sent < flen ? EPOLLOUT : 0), .data.ptr = s };
    epoll_ctl(epfd, EPOLL_CTL_MOD, s->fd, &ev);
}

/* Handle readiness on a slot. */
static void on_event(struct slot *s, uint32_t events) {
    static unsigned char buf[65536];
    if (s->state == FREE) return;
    if (s->state == CONNECTING) {
        int err = 0; socklen_t len = sizeof err;
        getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) { finish(s, 0); return; }
        s->state = WAITING;
        if (req_mode && send_req(s) < 0) { finish(s, 0); return; }
        set_events(s);          /* from now on only EPOLLIN (+EPOLLOUT if frame unsent) */
    } else if (req_mode && s->sent < flen && (events & EPOLLOUT)) {
        if (send_req(s) < 0) { finish(s, 0); return; }
        if (s->sent == flen) set_events(s);
    }
    if (!(events & (EPOLLIN | EPOLLERR | EPOLLHUP))) return;

    for (;;) {
        ssize_t n = read(s->fd, buf, sizeof buf);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;   /* wait for more */
        if (!req_mode) {        /* fin: EOF or reset from the server completes it */
            if (n == 0 || (n < 0 && errno == ECONNRESET)) { finish(s, 1); return; }
            if (n < 0) { finish(s, 0); return; }
            continue;           /* unexpected data: ignore */
        }
        if (n <= 0) { finish(s, 0); return; }        /* closed before full response */
        size_t off = 0;         /* collect the 4-byte size prefix, then count body bytes */
        while (s->got < 4 && off < (size_t)n) s->hdr[s->got++] = buf[off++];
        if (s->got < 4) continue;
        if (s->need == 0)
            s->need = 4 + ((uint32_t)s->hdr[0] << 24 | s->hdr[1] << 16 | s->hdr[2] << 8 | s->hdr[3]);
        s->got += n - off;
        if (s->got >= s->need) { finish(s, 1); return; }
    }
}

int main(int argc, char **argv) {
    if (argc < 6 || argc > 8) {
        fprintf(stderr, "usage: %s HOST PORT INFLIGHT SECONDS MODE(fin|req) [FRAMEFILE] [SRC_BASE]\n", argv[0]);
        return 2;
    }
    int inflight = atoi(argv[3]);
    double secs = atof(argv[4]);
    req_mode = strcmp(argv[5], "req") == 0;
    if (!req_mode && strcmp(argv[5], "fin") != 0) { fprintf(stderr, "MODE must be fin or req\n"); return 2; }
    if (argc > 7) src_base = atoi(argv[7]);
    if (inflight < 1 || secs <= 0 || src_base < 1 || src_base + NSRC - 1 > 254) {
        fprintf(stderr, "bad INFLIGHT/SECONDS/SRC_BASE (SRC_BASE 1..155)\n");
        return 2;
    }
    if (req_mode) {
        FILE *f = argc > 6 ? fopen(argv[6], "rb") : NULL;
        if (!f) { fprintf(stderr, "req mode needs a readable FRAMEFILE\n"); return 2; }
        frame = malloc(1 << 20);
        flen = fread(frame, 1, 1 << 20, f);
        fclose(f);
        if (flen < 4 || ntohl(*(uint32_t *)frame) != flen - 4) { fprintf(stderr, "bad FRAMEFILE\n"); return 2; }
    }
    signal(SIGPIPE, SIG_IGN);
    dst.sin_family = AF_INET;
    dst.sin_port = htons(atoi(argv[2]));
    if (inet_pton(AF_INET, argv[1], &dst.sin_addr) != 1) { fprintf(stderr, "bad HOST\n"); return 2; }

    epfd = epoll_create1(0);
    struct slot *slots = calloc(inflight, sizeof *slots);
    struct epoll_event evs[256];
    double t0 = now_s(), t = t0, t_end = t0 + secs, next_sweep = t0;

    while (t < t_end) {
        for (int i = 0; i < inflight; i++)          /* refill free slots */
            if (slots[i].state == FREE) start(&slots[i], t);
        int n = epoll_wait(epfd, evs, 256, 10);
        for (int i = 0; i < n; i++) on_event(evs[i].data.ptr, evs[i].events);
        t = now_s();
        if (t >= next_sweep) {                      /* per-connection timeouts */
            for (int i = 0; i < inflight; i++)
                if (slots[i].state != FREE && t - slots[i].started > TIMEOUT_S) finish(&slots[i], 0);
            next_sweep = t + 0.1;
        }
    }
    double s = now_s() - t0;
    printf("{\"connections\": %ld, \"seconds\": %.3f, \"rate\": %.1f, \"errors\": %ld, \"inflight\": %d}\n",
           completed, s, completed / s, errors, inflight);
    return 0;
}
