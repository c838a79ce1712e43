/* serve_conn.h - the connections of `kvq serve`: an absolute deadline for a
 * request to arrive whole, and the limits on open connections, in total and
 * per client address (serve_conn.c). serve_http.c calls these from
 * libmicrohttpd's callbacks. */
#ifndef KVQ_SERVE_CONN_H
#define KVQ_SERVE_CONN_H

#include <sys/socket.h>

struct serve_conns;
struct serve_conn;

/** Starts the deadline thread. timeout_s: seconds a connection may take to
 *  deliver a whole request (headers and body); max_conns: open connections;
 *  max_per_ip: of those from one address (0: no such limit); quiet: no log
 *  lines. @return NULL when out of memory or threads. */
struct serve_conns *serve_conns_start(int timeout_s, int max_conns, int max_per_ip, int quiet);
/** Stops the thread; every connection must have been closed. */
void serve_conns_stop(struct serve_conns *g);

/** The accept policy: 1 to take a connection from addr, 0 to refuse it (a
 *  limit is reached; logged, at most once in a few seconds with the count). */
int serve_conns_admit(struct serve_conns *g, const struct sockaddr *addr, socklen_t len);
/** A connection on fd from addr opened: its deadline starts. @return its
 *  record (NULL without memory: the connection then has no deadline). */
struct serve_conn *serve_conns_opened(struct serve_conns *g, int fd, const struct sockaddr *addr, socklen_t len);
/** Its request arrived whole: no deadline while it is answered. */
void serve_conns_received(struct serve_conns *g, struct serve_conn *c);
/** Its answer went out: the next request on it has a deadline again. */
void serve_conns_rearm(struct serve_conns *g, struct serve_conn *c);
/** It closed (before its socket is): forgets the record. */
void serve_conns_closed(struct serve_conns *g, struct serve_conn *c);

#endif
