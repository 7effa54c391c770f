/*
 * rrclient.c - pipelined request/response load generator (single thread, epoll).
 *
 * Usage: rrclient HOST PORT NCONN DEPTH SECONDS FRAMEFILE [WARMUP_SECONDS] [kafka|echo] [INTERVAL_US]
 *
 * FRAMEFILE holds one request frame exactly as sent on the wire (4-byte
 * big-endian size N, then N bytes).  Each of NCONN connections keeps DEPTH
 * copies of it in flight: when k responses arrive, k more copies are queued
 * and sent with one write().  Responses are size-prefixed frames as well and
 * are parsed incrementally without copying bodies.  Correlation id check:
 *   kafka: response body[0:4] == request body[4:8]
 *   echo : response body[4:8] == request body[4:8]
 *
 * Latency: the CLOCK_MONOTONIC time (taken just before the call) of the
 * write() that carries a request's first byte goes into a per-connection
 * FIFO ring (DEPTH entries); when a response completes (responses come back
 * in order) latency = read time - oldest send time.  Responses completing
 * in the measurement window (after warm-up) go into a log-linear histogram
 * (exact below 128 ns, then 64 sub-buckets per power of two = <= 1.6%
 * resolution, up to ~68 s; values are reported as bucket midpoints, max
 * exactly).
 *
 * Pacing (INTERVAL_US > 0; default 0 = as fast as possible): each connection
 * has its own schedule of due times INTERVAL_US apart (first sends staggered
 * over one interval across connections) and never sends before its due time.
 * Slots missed by more than INTERVAL_US/2 are skipped, not caught up (sends
 * are >= INTERVAL_US/2 apart, no bursts); the grid's phase is kept so that
 * connections never lock into one burst.  A send tops the connection up to
 * DEPTH requests in flight with one write(), so with DEPTH 1 the total rate
 * is NCONN * 1e6 / INTERVAL_US req/s (as long as latency stays below the
 * interval).  A connection that is due but still has DEPTH requests
 * in flight sends as soon as a response frees a slot; a send more than
 * INTERVAL_US/2 after its due time counts as a "late_send".  Latency is
 * measured from the actual write, not the scheduled time (so late sends hide
 * some queueing: see late_sends).  Wake-ups use epoll_pwait2 (ns timeout).
 *
 * Prints one JSON line:
 *   {"responses","seconds","rps","conns","depth","errors",
 *    "p50_us","p99_us","p999_us","max_us","late_sends"}
 * exit code 0 iff no errors.
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
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RBUF_SIZE (256 * 1024)

/* latency histogram (values in ns): idx < 128 exact; above, 64 sub-buckets
 * per power of two.  Values are clamped to 2^36-1 ns (~68.7 s). */
#define H_SUB_BITS 6
#define H_SUB (1 << H_SUB_BITS)                 /* 64 */
#define H_MAXBITS 36
#define H_NBUCKETS ((H_MAXBITS - H_SUB_BITS) * H_SUB + 2 * H_SUB)

struct conn {
    int fd, alive, connecting, want_out;
    unsigned char *wbuf;        /* queued request bytes (capacity DEPTH frames) */
    size_t woff, wlen;          /* unsent bytes are wbuf[woff..wlen) */
    unsigned char hdr[4];       /* response parser state */
    int hdr_got;
    uint32_t body_left, body_pos;
    unsigned char cid[4];       /* correlation id bytes collected from body */
    int inflight;               /* requests queued or awaiting a response (<= DEPTH) */
    size_t wpartial;            /* bytes of the current request already written */
    uint64_t wstart;            /* time the current request's first byte was written */
    uint64_t *sent;             /* FIFO ring of send times (DEPTH entries) */
    int shead, scount;
    uint64_t due;               /* paced mode: earliest time of the next send */
};

static unsigned char *frame;    /* the request frame incl. size prefix */
static size_t flen;
static int depth, cid_off;      /* cid_off: 0 (kafka) or 4 (echo) */
static long errors, alive_conns;
static int epfd;
static int measuring;           /* inside the measurement window */
static uint64_t interval_ns;    /* pacing interval, 0 = unpaced */
static long late_sends;

static uint64_t hist[H_NBUCKETS];
static uint64_t hist_n, hist_max;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

static double now_s(void) { return now_ns() / 1e9; }

static void hist_add(uint64_t v) {
    if (v > hist_max) hist_max = v;
    if (v >= (1ull << H_MAXBITS)) v = (1ull << H_MAXBITS) - 1;
    int idx;
    if (v < 2 * H_SUB) idx = (int)v;
    else {
        int shift = (63 - __builtin_clzll(v)) - H_SUB_BITS;     /* >= 1 */
        idx = shift * H_SUB + (int)(v >> shift);                /* v>>shift in [64,128) */
    }
    hist[idx]++;
    hist_n++;
}

/* Value (ns) at quantile q: midpoint of the bucket holding the rank, capped at max. */
static double hist_quantile(double q) {
    if (hist_n == 0) return 0;
    uint64_t rank = (uint64_t)(q * hist_n + 0.999999), cum = 0;
    if (rank < 1) rank = 1;
    if (rank > hist_n) rank = hist_n;
    for (int i = 0; i < H_NBUCKETS; i++) {
        cum += hist[i];
        if (cum >= rank) {
            double mid;
            if (i < 2 * H_SUB) mid = i;
            else {
                int shift = i / H_SUB - 1;
                uint64_t lo = (uint64_t)(i % H_SUB + H_SUB) << shift;
                mid = lo + ((1ull << shift) - 1) / 2.0;
            }
            return mid < (double)hist_max ? mid : (double)hist_max;
        }
    }
    return hist_max;
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

/* Try to send whatever is queued; arm EPOLLOUT if the kernel took only part.
 * Every request whose last byte went out is pushed on the send-time ring with
 * the time of the write() that carried its first byte. */
static void flush(struct conn *c) {
    if (c->woff == c->wlen) { set_out(c, 0); return; }  /* e.g. paced conn not yet due */
    uint64_t t = now_ns();      /* before write(): on loopback the reply can beat its return */
    ssize_t n = write(c->fd, c->wbuf + c->woff, c->wlen - c->woff);
    if (n < 0) {
        if (errno != EAGAIN && errno != EINTR) { kill_conn(c); return; }
        n = 0;
    }
    if (n > 0) {
        size_t left = n;
        while (left > 0) {
            if (c->wpartial == 0) c->wstart = t;
            size_t need = flen - c->wpartial;
            if (left < need) { c->wpartial += left; break; }
            left -= need;
            c->wpartial = 0;
            c->sent[(c->shead + c->scount) % depth] = c->wstart;   /* scount < DEPTH */
            c->scount++;
        }
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
    c->inflight += k;
}

/* Paced mode: if the connection is due and has a free slot, top it up to
 * DEPTH requests in flight with one write and schedule the next send. */
static void send_due(struct conn *c, uint64_t t) {
    if (!c->alive || c->connecting || c->inflight >= depth || t < c->due) return;
    int late = t - c->due > interval_ns / 2;
    if (measuring && late) late_sends++;
    int pending = c->wlen != 0;
    queue(c, depth - c->inflight);
    if (!pending) flush(c);                     /* else EPOLLOUT will send it */
    /* Keep each connection on its own fixed grid of due times (its phase):
     * basing the next due time on the send time would let connections served
     * in the same loop pass (e.g. after a stall) share one timestamp and lock
     * into a single burst for good.  Missed slots are skipped, not caught up:
     * the next send is at least interval/2 after this one. */
    uint64_t next = c->due + interval_ns;
    if (next < t + interval_ns / 2)
        next += (t + interval_ns / 2 - next + interval_ns - 1) / interval_ns * interval_ns;
    c->due = next;
}

/* Parse response bytes read at time t; returns number of complete responses,
 * -1 on bad frame.  Records one latency per response while measuring. */
static int parse(struct conn *c, const unsigned char *p, size_t n, uint64_t t) {
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
            if (c->scount == 0) return -1;      /* response without a request */
            uint64_t ts = c->sent[c->shead];
            c->shead = (c->shead + 1) % depth;
            c->scount--;
            c->inflight--;
            if (measuring) hist_add(t > ts ? t - ts : 0);
            c->hdr_got = 0;
            done++;
        }
    }
    return done;
}

int main(int argc, char **argv) {
    if (argc < 7 || argc > 10) {
        fprintf(stderr, "usage: %s HOST PORT NCONN DEPTH SECONDS FRAMEFILE [WARMUP_SECONDS] [kafka|echo] [INTERVAL_US]\n", argv[0]);
        return 2;
    }
    int nconn = atoi(argv[3]);
    depth = atoi(argv[4]);
    double secs = atof(argv[5]), warmup = argc > 7 ? atof(argv[7]) : 0.5;
    if (argc > 8 && strcmp(argv[8], "echo") == 0) cid_off = 4;
    else if (argc > 8 && strcmp(argv[8], "kafka") != 0) { fprintf(stderr, "mode must be kafka or echo\n"); return 2; }
    if (nconn < 1 || depth < 1 || secs <= 0) { fprintf(stderr, "bad NCONN/DEPTH/SECONDS\n"); return 2; }
    double interval_us = argc > 9 ? atof(argv[9]) : 0;
    if (!(interval_us >= 0 && interval_us <= 1e9)) { fprintf(stderr, "bad INTERVAL_US\n"); return 2; }
    interval_ns = (uint64_t)(interval_us * 1000 + 0.5);
    if (interval_ns) prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);   /* precise wake-ups */
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
        c->sent = malloc(sizeof *c->sent * depth);
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
    long responses = 0;
    int use_pwait2 = 1;

    while (alive_conns > 0) {
        uint64_t tn = now_ns();
        t = tn / 1e9;
        if (!measuring && t >= t_meas) { measuring = 1; t_start = t; t_end = t + secs; }
        if (measuring && t >= t_end) break;
        int n;
        if (interval_ns) {
            /* send what is due, then sleep until the earliest future due time
             * of a connection with a free slot (others wait for a response) */
            uint64_t wake = tn + 10000000;      /* 10 ms, as in unpaced mode */
            for (int i = 0; i < nconn; i++) {
                struct conn *c = &conns[i];
                send_due(c, tn);
                if (c->alive && !c->connecting && c->inflight < depth && c->due < wake) wake = c->due;
            }
            tn = now_ns();
            uint64_t wait = wake > tn ? wake - tn : 0;
            if (use_pwait2) {
                struct timespec to = { .tv_sec = wait / 1000000000u, .tv_nsec = wait % 1000000000u };
                n = epoll_pwait2(epfd, evs, 256, &to, NULL);
                if (n < 0 && errno == ENOSYS) use_pwait2 = 0;
            }
            if (!use_pwait2)                    /* old kernel: ms resolution, rounded up */
                n = epoll_wait(epfd, evs, 256, (int)((wait + 999999) / 1000000));
        } else
            n = epoll_wait(epfd, evs, 256, 10);
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (!c->alive) continue;                    /* died earlier in this batch */
            if (c->connecting) {
                int err = 0; socklen_t len = sizeof err;
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err) { kill_conn(c); continue; }
                c->connecting = 0;
                if (interval_ns) {                      /* stagger first sends over one interval */
                    c->due = now_ns() + interval_ns * (uint64_t)(c - conns) / nconn;
                    send_due(c, now_ns());
                    set_out(c, c->wlen != 0);           /* not due yet: stop EPOLLOUT */
                    continue;
                }
                queue(c, depth);                        /* initial DEPTH copies, one write */
                flush(c);
                continue;
            }
            if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
                ssize_t r = read(c->fd, rbuf, sizeof rbuf);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) { kill_conn(c); continue; }
                if (r > 0) {
                    uint64_t tr = now_ns();
                    int k = parse(c, rbuf, r, tr);
                    if (k < 0) { kill_conn(c); continue; }
                    if (measuring) responses += k;
                    if (k > 0 && interval_ns) send_due(c, tr);   /* late sends go out at once */
                    else if (k > 0) {
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
    printf("{\"responses\": %ld, \"seconds\": %.3f, \"rps\": %.1f, \"conns\": %d, \"depth\": %d, \"errors\": %ld, "
           "\"p50_us\": %.3f, \"p99_us\": %.3f, \"p999_us\": %.3f, \"max_us\": %.3f, \"late_sends\": %ld}\n",
           responses, s, s > 0 ? responses / s : 0.0, nconn, depth, errors,
           hist_quantile(0.50) / 1e3, hist_quantile(0.99) / 1e3, hist_quantile(0.999) / 1e3,
           hist_max / 1e3, late_sends);
    return errors ? 1 : 0;
}
