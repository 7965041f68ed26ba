/*
 * metrics.h -- Prometheus text exposition (format 0.0.4) of a kvpeer node,
 * and the snapshot helpers the daemon's inspection endpoints share.
 */
#ifndef KVPD_METRICS_H
#define KVPD_METRICS_H

#include "kvpeer.h"

#include <stddef.h>
#include <stdint.h>

/* Growable text buffer. Owns p (heap, NUL-terminated); freed by
 * kvpd_buf_free. An allocation failure sets `oom` and drops further text. */
typedef struct kvpd_buf {
    char *p;
    size_t len, cap;
    int oom;
} kvpd_buf_t;

void kvpd_buf_printf(kvpd_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvpd_buf_free(kvpd_buf_t *b);

/* Snapshots with enough room (grown until the node's answer fits). On
 * success *out is heap (caller frees with free()) and *n its length. */
kvp_status_t kvpd_peers_snapshot(kvp_node_t *node, kvp_peer_info_t **out, uint32_t *n);
kvp_status_t kvpd_held_snapshot(kvp_node_t *node, kvp_held_item_t **out, uint32_t *n);
kvp_status_t kvpd_states_snapshot(kvp_node_t *node, kvp_peer_state_t **out, uint32_t *n);
void kvpd_metrics_format_states(kvpd_buf_t *b, const kvp_peer_state_t *ps, uint32_t n,
                                const kvp_refusal_stats_t *r);

/* Render the exposition from snapshots (pure: unit-testable). */
void kvpd_metrics_format(kvpd_buf_t *b, const kvp_stats_t *st, const kvp_peer_info_t *peers,
                         uint32_t npeers);
/* Snapshot the node and render. */
kvp_status_t kvpd_metrics_render(kvp_node_t *node, kvpd_buf_t *b);

#endif
