/*
 * kvpeerd.c -- a kvpeer node as a daemon (SPEC §10).
 *
 * main: settings (options.c) -> kvp_node_create (own progress thread) ->
 * peers from the config -> HTTP (kvpeerd_http.c) -> the main loop, which
 * polls a signalfd and kvp_node_fd() and dispatches events to waiting admin
 * requests. SIGINT/SIGTERM: waiters give up, HTTP stops, kvp_node_destroy()
 * runs the bounded drain (shutdown_drain_ms), exit 0.
 * Exit codes: 0 clean, 1 start-up failure, 2 bad configuration.
 */
#include "kvpeerd.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

/* Signals are blocked in every thread (the mask is inherited by the node's
 * and libmicrohttpd's threads, created later) and read from a signalfd. */
static int signals_open(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0)
        return -1;
    signal(SIGPIPE, SIG_IGN); /* a client that hangs up is not a reason to die */
    return signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

static int peers_connect(kvpd_t *d)
{
    char addr[300];
    for (const char *p = d->set.peers; *p;) {
        size_t n = strcspn(p, ",");
        snprintf(addr, sizeof(addr), "%.*s", (int)(n < 299 ? n : 299), p);
        p += n;
        if (*p == ',')
            p++;
        if (addr[0] == '\0')
            continue;
        kvp_status_t st = kvp_peer_add(d->node, addr);
        if (st != KVP_OK) {
            kvpd_log(KVPD_LOG_ERROR, "peer_add_failed", "peer=%s status=\"%s\"", addr,
                     kvp_status_str(st));
            return -1;
        }
        kvpd_log(KVPD_LOG_INFO, "peer_add", "peer=%s", addr);
    }
    return 0;
}

/* The ready file is written once (tmp + rename), after everything is up, so
 * a reader never sees a partial line. */
static int ready_file_write(kvpd_t *d)
{
    char tmp[4096 + 8];
    if (d->set.ready_file[0] == '\0')
        return 0;
    snprintf(tmp, sizeof(tmp), "%s.tmp", d->set.ready_file);
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        goto fail;
    fprintf(f, "peer=%s http=%s pid=%ld\n", kvp_node_peer_id(d->node),
            d->http_addr[0] ? d->http_addr : "-", (long)getpid());
    if (fclose(f) != 0 || rename(tmp, d->set.ready_file) != 0)
        goto fail;
    return 0;
fail:
    kvpd_log(KVPD_LOG_ERROR, "ready_file_failed", "path=%s error=\"%s\"", d->set.ready_file,
             strerror(errno));
    return -1;
}

/* Returns the signal that ended the loop. */
static int main_loop(kvpd_t *d, int sigfd)
{
    struct pollfd pfd[2] = {{sigfd, POLLIN, 0}, {kvp_node_fd(d->node), POLLIN, 0}};
    for (;;) {
        int r = poll(pfd, 2, 1000);
        if (r < 0 && errno != EINTR) {
            kvpd_log(KVPD_LOG_ERROR, "poll_failed", "error=\"%s\"", strerror(errno));
            return 0;
        }
        if (r > 0 && (pfd[0].revents & POLLIN)) {
            struct signalfd_siginfo si;
            if (read(sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
                return (int)si.ssi_signo;
        }
        /* Events are also drained on the 1 s tick: a missed wakeup costs
         * at most that, never a hung admin request. */
        kvpd_dispatch(d);
    }
}

static int daemon_start(kvpd_t *d)
{
    kvp_status_t st = kvp_node_create(&d->set.cfg, &d->node);
    if (st != KVP_OK) {
        kvpd_log(KVPD_LOG_ERROR, "node_create_failed", "listen=%s status=\"%s\"",
                 d->set.listen, kvp_status_str(st));
        return -1;
    }
    kvpd_log(KVPD_LOG_INFO, "node_up",
             "peer=%s num_blocks=%u block_size=%u transport=ucx admin=%d drain_ms=%u",
             kvp_node_peer_id(d->node), d->set.cfg.num_blocks, d->set.cfg.block_size,
             d->set.admin ? 1 : 0, d->set.cfg.shutdown_drain_ms);
    if (peers_connect(d) != 0)
        return -1;
    if (d->set.http[0] && kvpd_http_start(d) != 0)
        return -1;
    return ready_file_write(d);
}

static void daemon_stop(kvpd_t *d)
{
    kvpd_ops_stop(d);
    kvpd_http_stop(d);
    if (d->node) {
        kvpd_log(KVPD_LOG_INFO, "drain_start", "drain_ms=%u", d->set.cfg.shutdown_drain_ms);
        uint64_t t0 = kvpd_now_ms();
        kvp_node_destroy(d->node);
        d->node = NULL;
        kvpd_log(KVPD_LOG_INFO, "drain_done", "elapsed_ms=%llu",
                 (unsigned long long)(kvpd_now_ms() - t0));
    }
    kvpd_ops_free_all(d);
}

int main(int argc, char **argv)
{
    kvpd_t d;
    int rc = 1, sigfd;
    memset(&d, 0, sizeof(d));
    kvpd_settings_init(&d.set);
    switch (kvpd_settings_load(&d.set, argc, argv, stdout, stderr)) {
    case KVPD_LOAD_RUN: break;
    case KVPD_LOAD_EXIT: kvpd_settings_free(&d.set); return 0;
    default: kvpd_settings_free(&d.set); return 2;
    }
    kvpd_log_set_level(d.set.log_level);
    if ((sigfd = signals_open()) < 0) {
        kvpd_log(KVPD_LOG_ERROR, "signalfd_failed", "error=\"%s\"", strerror(errno));
        kvpd_settings_free(&d.set);
        return 1;
    }
    pthread_mutex_init(&d.lock, NULL);
    pthread_cond_init(&d.cond, NULL);
    if (daemon_start(&d) == 0) {
        int sig = main_loop(&d, sigfd);
        kvpd_log(KVPD_LOG_INFO, "shutdown", "signal=%s", sig ? strsignal(sig) : "none");
        rc = 0;
    }
    daemon_stop(&d);
    pthread_cond_destroy(&d.cond);
    pthread_mutex_destroy(&d.lock);
    close(sigfd);
    kvpd_log(KVPD_LOG_INFO, "exit", "code=%d", rc);
    kvpd_settings_free(&d.set);
    return rc;
}
