/* serve_conn.h - the connections of `kvq serve` over libmicrohttpd: an
 * absolute deadline for a request to arrive whole, and the limits on open
 * connections, in total and per client address (serve_conn.c). serve_http.c
 * hands these callbacks to MHD_start_daemon and calls the last two from its
 * request callbacks. */
#ifndef KVQ_SERVE_CONN_H
#define KVQ_SERVE_CONN_H

#include <microhttpd.h>
#include <stddef.h>
#include <sys/socket.h>

struct serve_conns;

/** Makes room for max_conns sockets (the soft open-file limit raised as far
 *  as the hard one allows) and starts the deadline thread. timeout_s:
 *  seconds a connection may take to deliver a whole request (headers and
 *  body); max_conns: open connections; max_per_ip: of those from one address
 *  (0: no such limit); quiet: no log lines. @return 0 and *out; 2 (the open
 *  files do not allow max_conns) or 1 (no memory or threads) with err. */
int serve_conns_start(int timeout_s, int max_conns, int max_per_ip, int quiet, struct serve_conns **out, char *err,
                      size_t cap);
/** Stops the thread; libmicrohttpd must have been stopped. */
void serve_conns_stop(struct serve_conns *g);

/** libmicrohttpd's accept policy (cls: the serve_conns): MHD_NO when a limit
 *  is reached, logged at once and then at most every few seconds with the
 *  count. */
enum MHD_Result serve_conns_admit(void *cls, const struct sockaddr *addr, socklen_t len);
/** MHD_OPTION_NOTIFY_CONNECTION's callback (cls: the serve_conns): a
 *  connection's deadline starts when it opens; it is forgotten when it
 *  closes (before libmicrohttpd closes its socket). */
void serve_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                        enum MHD_ConnectionNotificationCode what);
/** c's request arrived whole: no deadline while it is answered. */
void serve_conns_received(struct serve_conns *g, struct MHD_Connection *c);
/** c's answer went out: the next request on it has a deadline again. */
void serve_conns_rearm(struct serve_conns *g, struct MHD_Connection *c);

#endif
