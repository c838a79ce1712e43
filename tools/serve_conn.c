/* serve_conn.c - the connection guard of `kvq serve` (serve_conn.h).
 *
 * libmicrohttpd's connection timeout counts from the last byte received, so
 * a client that sends one byte a second keeps its connection forever
 * (slowloris), and about a thousand of them leave no connection for anyone
 * else. Here each connection has an absolute deadline instead: --timeout
 * seconds from the moment it is ready for a request (accepted, or its last
 * answer sent) until that request has arrived whole, headers and body. A
 * thread looks every DEADLINE_TICK_MS and shuts down the socket of a
 * connection past its deadline; libmicrohttpd then sees the peer gone and
 * closes it. That is safe against the socket being closed and its number
 * reused meanwhile: libmicrohttpd notifies the close (closed() takes the
 * same lock) before it closes the socket.
 *
 * An idle connection (nothing sent) never gets here: libmicrohttpd's idle
 * timeout of the same length started earlier (before the notification that
 * arms the deadline) and closes it first, so what is closed and logged here
 * is a slow client, not a pooled connection left open. "First" needs a
 * margin: libmicrohttpd 0.9.7x counts that timeout in whole seconds and may
 * close up to a second late, so the deadline is DEADLINE_GRACE_S later.
 *
 * The limits are enforced here too, in libmicrohttpd's accept policy
 * callback, rather than by its own options: those refuse before the callback
 * runs and say nothing, and a refusal should leave a line in the log. Every
 * call but the deadline thread's and received/rearm comes from
 * libmicrohttpd's one listening thread, so the counts it checks are exact. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "serve_conn.h"

#define DEADLINE_TICK_MS 100
#define DEADLINE_GRACE_S 1.5 /* past libmicrohttpd's idle timeout (whole seconds) */
#define LOG_EVERY_S 10.0 /* a flood of refusals gives one line per this long */
/* open files beyond the connections' sockets: stdio, the listening socket,
 * what loading keeps */
#define SPARE_FILES 16

struct serve_conn {
    int fd;
    unsigned char addr[16]; /* the client's IPv4 or IPv6 address */
    size_t addr_len;
    double deadline;        /* 0: none (its request is being answered) */
    int shut;
    struct serve_conn *prev, *next;
};

/* A kind of event that is logged at most once per LOG_EVERY_S. */
struct logged {
    double last;
    long pending;
};

struct serve_conns {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_t thread;
    int stop;
    int timeout_s, max_conns, max_per_ip, quiet;
    struct serve_conn *head;
    int n;
    struct logged timed_out, over_total, over_ip;
    char over_ip_addr[64];
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The address bytes of a (no port: one client, many connections). */
static size_t addr_key(const struct sockaddr *a, socklen_t len, unsigned char out[16])
{
    if (a && a->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        memcpy(out, &((const struct sockaddr_in *)(const void *)a)->sin_addr, 4);
        return 4;
    }
    if (a && a->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        memcpy(out, &((const struct sockaddr_in6 *)(const void *)a)->sin6_addr, 16);
        return 16;
    }
    return 0;
}

/* Logs what is pending of l once LOG_EVERY_S has passed since its last line
 * (or now when force); mu held. */
static void flush_log(struct serve_conns *g, struct logged *l, double now, int force)
{
    if (!l->pending || (!force && now - l->last < LOG_EVERY_S))
        return;
    if (!g->quiet) {
        if (l == &g->timed_out)
            fprintf(stderr,
                    "kvq serve: closed %ld connection%s that sent no whole request within --timeout %d s "
                    "(slow or stalled clients)\n",
                    l->pending, l->pending == 1 ? "" : "s", g->timeout_s);
        else if (l == &g->over_total)
            fprintf(stderr, "kvq serve: refused %ld connection%s: %d connections are open (--max-conns %d)\n",
                    l->pending, l->pending == 1 ? "" : "s", g->n, g->max_conns);
        else
            fprintf(stderr,
                    "kvq serve: refused %ld connection%s: the client %s already holds %d (--max-conns-per-ip %d)\n",
                    l->pending, l->pending == 1 ? "" : "s", g->over_ip_addr, g->max_per_ip, g->max_per_ip);
        fflush(stderr);
    }
    l->pending = 0;
    l->last = now;
}

/* An event of kind l: the first of a quiet spell is logged at once, the rest
 * are counted into the next line. mu held. */
static void note(struct serve_conns *g, struct logged *l, double now)
{
    l->pending++;
    flush_log(g, l, now, 0);
}

static void *deadline_thread(void *arg)
{
    struct serve_conns *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        const double now = now_s();
        for (struct serve_conn *c = g->head; c; c = c->next) {
            if (c->deadline > 0 && now >= c->deadline && !c->shut) {
                /* both ways: the connection's thread wakes from its poll and closes it */
                shutdown(c->fd, SHUT_RDWR);
                c->shut = 1;
                note(g, &g->timed_out, now);
            }
        }
        flush_log(g, &g->timed_out, now, 0);
        flush_log(g, &g->over_total, now, 0);
        flush_log(g, &g->over_ip, now, 0);
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += DEADLINE_TICK_MS * 1000000L;
        t.tv_sec += t.tv_nsec / 1000000000L;
        t.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&g->cond, &g->mu, &t);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* Room for max_conns sockets: the soft open-file limit raised as far as the
 * hard one allows. @return 0, or 2 with err. */
static int files_for(int max_conns, char *err, size_t cap)
{
    struct rlimit rl;
    const rlim_t need = (rlim_t)max_conns + SPARE_FILES;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
        return 0;
    rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0 && want >= need)
        return 0;
    snprintf(err, cap, "--max-conns %d needs %llu open files; this process may have %llu (ulimit -n)", max_conns,
             (unsigned long long)need, (unsigned long long)want);
    return 2;
}

int serve_conns_start(int timeout_s, int max_conns, int max_per_ip, int quiet, struct serve_conns **out, char *err,
                      size_t cap)
{
    *out = NULL;
    if (files_for(max_conns, err, cap))
        return 2;
    struct serve_conns *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, cap, "out of memory");
        return 1;
    }
    g->timeout_s = timeout_s;
    g->max_conns = max_conns;
    g->max_per_ip = max_per_ip;
    g->quiet = quiet;
    /* the first refusal of a flood is logged at once */
    g->timed_out.last = g->over_total.last = g->over_ip.last = now_s() - LOG_EVERY_S;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cond, NULL);
    if (pthread_create(&g->thread, NULL, deadline_thread, g) != 0) {
        pthread_cond_destroy(&g->cond);
        pthread_mutex_destroy(&g->mu);
        free(g);
        snprintf(err, cap, "cannot start a thread");
        return 1;
    }
    *out = g;
    return 0;
}

void serve_conns_stop(struct serve_conns *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_signal(&g->cond);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    const double now = now_s();
    flush_log(g, &g->timed_out, now, 1);
    flush_log(g, &g->over_total, now, 1);
    flush_log(g, &g->over_ip, now, 1);
    while (g->head) { /* not expected: libmicrohttpd closed every connection */
        struct serve_conn *c = g->head;
        g->head = c->next;
        free(c);
    }
    pthread_cond_destroy(&g->cond);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

enum MHD_Result serve_conns_admit(void *cls, const struct sockaddr *addr, socklen_t len)
{
    struct serve_conns *g = cls;
    unsigned char key[16];
    const size_t kn = addr_key(addr, len, key);
    pthread_mutex_lock(&g->mu);
    const double now = now_s();
    int ok = 1;
    if (g->n >= g->max_conns) {
        note(g, &g->over_total, now);
        ok = 0;
    } else if (g->max_per_ip > 0 && kn) {
        int same = 0;
        for (const struct serve_conn *c = g->head; c; c = c->next)
            same += c->addr_len == kn && memcmp(c->addr, key, kn) == 0;
        if (same >= g->max_per_ip) {
            if (!inet_ntop(addr->sa_family, key, g->over_ip_addr, sizeof g->over_ip_addr))
                snprintf(g->over_ip_addr, sizeof g->over_ip_addr, "?");
            note(g, &g->over_ip, now);
            ok = 0;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return ok ? MHD_YES : MHD_NO;
}

/* A connection's deadline armed now. mu held or not: reads what create set. */
static double deadline_from_now(const struct serve_conns *g) { return now_s() + g->timeout_s + DEADLINE_GRACE_S; }

static struct serve_conn *opened(struct serve_conns *g, int fd, const struct sockaddr *addr, socklen_t len)
{
    struct serve_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->fd = fd;
    c->addr_len = addr_key(addr, len, c->addr);
    pthread_mutex_lock(&g->mu);
    c->deadline = deadline_from_now(g);
    c->next = g->head;
    if (g->head)
        g->head->prev = c;
    g->head = c;
    g->n++;
    pthread_mutex_unlock(&g->mu);
    return c;
}

static struct serve_conn *conn_of(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void serve_conns_received(struct serve_conns *g, struct MHD_Connection *mc)
{
    struct serve_conn *c = conn_of(mc);
    if (!c)
        return;
    pthread_mutex_lock(&g->mu);
    c->deadline = 0;
    pthread_mutex_unlock(&g->mu);
}

void serve_conns_rearm(struct serve_conns *g, struct MHD_Connection *mc)
{
    struct serve_conn *c = conn_of(mc);
    if (!c)
        return;
    pthread_mutex_lock(&g->mu);
    c->deadline = deadline_from_now(g);
    pthread_mutex_unlock(&g->mu);
}

static void closed(struct serve_conns *g, struct serve_conn *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&g->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        g->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    g->n--;
    pthread_mutex_unlock(&g->mu);
    free(c);
}

void serve_conns_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                        enum MHD_ConnectionNotificationCode what)
{
    struct serve_conns *g = cls;
    if (what == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fd = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ad = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        const struct sockaddr *a = ad ? ad->client_addr : NULL;
        const socklen_t alen = !a ? 0 : a->sa_family == AF_INET6 ? (socklen_t)sizeof(struct sockaddr_in6)
                                                                 : (socklen_t)sizeof(struct sockaddr_in);
        /* without memory the connection goes without a deadline */
        *socket_context = fd ? opened(g, fd->connect_fd, a, alen) : NULL;
    } else {
        closed(g, *socket_context);
        *socket_context = NULL;
    }
}
