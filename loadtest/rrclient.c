/*
 * rrclient.c - pipelined request/response load generator (single thread, epoll).
 *
 * Usage: rrclient HOST PORT NCONN DEPTH SECONDS FRAMEFILE [WARMUP_SECONDS] [kafka|echo]
 *
 * FRAMEFILE holds one request frame exactly as sent on the wire (4-byte
 * big-endian size N, then N bytes).  Each of NCONN connections keeps DEPTH
 * copies of it in flight: when k responses arrive, k more copies are queued
 * and sent with one write().  Responses are size-prefixed frames as well and
 * are parsed incrementally without copying bodies.  Correlation id check:
 *   kafka: response body[0:4] == request body[4:8]
 *   echo : response body[4:8] == request body[4:8]
 * Prints one JSON line; exit code 0 iff no errors.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RBUF_SIZE (256 * 1024)

struct conn {
    int fd, alive, connecting, want_out;
    unsigned char *wbuf;        /* queued request bytes (capacity DEPTH frames) */
    size_t woff, wlen;          /* unsent bytes are wbuf[woff..wlen) */
    unsigned char hdr[4];       /* response parser state */
    int hdr_got;
    uint32_t body_left, body_pos;
    unsigned char cid[4];       /* correlation id bytes collected from body */
};

static unsigned char *frame;    /* the request frame incl. size prefix */
static size_t flen;
static int depth, cid_off;      /* cid_off: 0 (kafka) or 4 (echo) */
static long errors, alive_conns;
static int epfd;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void kill_conn(struct conn *c) {
    if (!c->alive) return;
    errors++;
    alive_conns--;
    c->alive = 0;
    close(c->fd);               /* also removes it from the epoll set */
}

static void set_out(struct conn *c, int on) {
    if (c->want_out == on) return;
    struct epoll_event ev = { .events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = c };
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = on;
}

/* Try to send whatever is queued; arm EPOLLOUT if the kernel took only part. */
static void flush(struct conn *c) {
    if (c->woff == c->wlen) return;
    ssize_t n = write(c->fd, c->wbuf + c->woff, c->wlen - c->woff);
    if (n < 0) {
        if (errno != EAGAIN && errno != EINTR) { kill_conn(c); return; }
        n = 0;
    }
    c->woff += n;
    if (c->woff == c->wlen) c->woff = c->wlen = 0;
    set_out(c, c->wlen != 0);
}

/* Queue k more request copies.  At most DEPTH requests are ever unsent or
 * outstanding, so after compaction the buffer always has room. */
static void queue(struct conn *c, int k) {
    if (c->woff) {
        memmove(c->wbuf, c->wbuf + c->woff, c->wlen - c->woff);
        c->wlen -= c->woff;
        c->woff = 0;
    }
    for (int i = 0; i < k; i++, c->wlen += flen)
        memcpy(c->wbuf + c->wlen, frame, flen);
}

/* Parse response bytes; returns number of complete responses, -1 on bad frame. */
static int parse(struct conn *c, const unsigned char *p, size_t n) {
    int done = 0;
    while (n > 0) {
        if (c->hdr_got < 4) {                   /* collecting size prefix */
            c->hdr[c->hdr_got++] = *p++; n--;
            if (c->hdr_got == 4) {
                int32_t sz = (int32_t)((uint32_t)c->hdr[0] << 24 | c->hdr[1] << 16 | c->hdr[2] << 8 | c->hdr[3]);
                if (sz < cid_off + 4) return -1;
                c->body_left = sz; c->body_pos = 0;
            }
            continue;
        }
        /* copy the correlation-id bytes if they lie in this chunk, skip the rest */
        size_t take = n < c->body_left ? n : c->body_left;
        for (size_t i = 0; i < take; i++) {
            uint32_t pos = c->body_pos + i;
            if (pos >= (uint32_t)cid_off + 4) break;
            if (pos >= (uint32_t)cid_off) c->cid[pos - cid_off] = p[i];
        }
        p += take; n -= take;
        c->body_pos += take; c->body_left -= take;
        if (c->body_left == 0) {                /* frame complete */
            if (memcmp(c->cid, frame + 8, 4) != 0) errors++;
            c->hdr_got = 0;
            done++;
        }
    }
    return done;
}

int main(int argc, char **argv) {
    if (argc < 7 || argc > 9) {
        fprintf(stderr, "usage: %s HOST PORT NCONN DEPTH SECONDS FRAMEFILE [WARMUP_SECONDS] [kafka|echo]\n", argv[0]);
        return 2;
    }
    int nconn = atoi(argv[3]);
    depth = atoi(argv[4]);
    double secs = atof(argv[5]), warmup = argc > 7 ? atof(argv[7]) : 0.5;
    if (argc > 8 && strcmp(argv[8], "echo") == 0) cid_off = 4;
    else if (argc > 8 && strcmp(argv[8], "kafka") != 0) { fprintf(stderr, "mode must be kafka or echo\n"); return 2; }
    if (nconn < 1 || depth < 1 || secs <= 0) { fprintf(stderr, "bad NCONN/DEPTH/SECONDS\n"); return 2; }
    signal(SIGPIPE, SIG_IGN);

    /* load and sanity-check the frame */
    FILE *f = fopen(argv[6], "rb");
    if (!f) { perror(argv[6]); return 2; }
    frame = malloc(1 << 20);
    flen = fread(frame, 1, 1 << 20, f);
    fclose(f);
    if (flen < 12 || ntohl(*(uint32_t *)frame) != flen - 4) {
        fprintf(stderr, "FRAMEFILE must hold one frame: 4-byte BE size N + N bytes (N >= 8)\n");
        return 2;
    }

    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
    if (inet_pton(AF_INET, argv[1], &sa.sin_addr) != 1) { fprintf(stderr, "bad HOST\n"); return 2; }

    epfd = epoll_create1(0);
    struct conn *conns = calloc(nconn, sizeof *conns);
    for (int i = 0; i < nconn; i++) {
        struct conn *c = &conns[i];
        c->wbuf = malloc(flen * depth);
        c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (c->fd < 0) { errors++; continue; }
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) {
            close(c->fd); errors++; continue;
        }
        c->alive = c->connecting = c->want_out = 1;
        alive_conns++;
        struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT, .data.ptr = c };
        epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev);
    }

    static unsigned char rbuf[RBUF_SIZE];
    struct epoll_event evs[256];
    double t = now_s(), t_meas = t + warmup, t_start = 0, t_end = 0;
    int measuring = 0;
    long responses = 0;

    while (alive_conns > 0) {
        t = now_s();
        if (!measuring && t >= t_meas) { measuring = 1; t_start = t; t_end = t + secs; }
        if (measuring && t >= t_end) break;
        int n = epoll_wait(epfd, evs, 256, 10);
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (!c->alive) continue;                    /* died earlier in this batch */
            if (c->connecting) {
                int err = 0; socklen_t len = sizeof err;
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err) { kill_conn(c); continue; }
                c->connecting = 0;
                queue(c, depth);                        /* initial DEPTH copies, one write */
                flush(c);
                continue;
            }
            if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
                ssize_t r = read(c->fd, rbuf, sizeof rbuf);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) { kill_conn(c); continue; }
                if (r > 0) {
                    int k = parse(c, rbuf, r);
                    if (k < 0) { kill_conn(c); continue; }
                    if (measuring) responses += k;
                    if (k > 0) {
                        int pending = c->wlen != 0;
                        queue(c, k);
                        if (!pending) flush(c);         /* else EPOLLOUT will send it */
                    }
                }
            }
            if (c->alive && (evs[i].events & EPOLLOUT)) flush(c);
        }
    }

    double s = measuring ? now_s() - t_start : 0;
    printf("{\"responses\": %ld, \"seconds\": %.3f, \"rps\": %.1f, \"conns\": %d, \"depth\": %d, \"errors\": %ld}\n",
           responses, s, s > 0 ? responses / s : 0.0, nconn, depth, errors);
    return errors ? 1 : 0;
}
