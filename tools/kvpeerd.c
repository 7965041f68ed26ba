/*
 * kvpeerd.c -- a kvpeer node as a daemon (SPEC §10).
 *
 * main: settings (options.c) -> kvp_node_create (own progress thread) ->
 * peers from the config -> HTTP (kvpeerd_http.c) -> the main loop, which
 * polls a signalfd and kvp_node_fd() and dispatches events to waiting admin
 * requests. SIGINT/SIGTERM: waiters give up, HTTP stops, kvp_node_destroy()
 * runs the bounded drain (shutdown_drain_ms), exit 0. SIGHUP: the log file
 * is reopened and the settings reloaded (log_level, new peers; the rest is
 * named as needing a restart).
 * Exit codes: 0 clean, 1 start-up failure, 2 bad configuration.
 */
#include "kvpeerd.h"

#include <errno.h>
#include <fcntl.h>
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
    sigaddset(&set, SIGHUP);
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
            kvpd_log(KVPD_LOG_ERROR, "peer_add_failed", "peer=%s status=\"%s\"",
                     kvpd_esc(addr).s, kvp_status_str(st));
            return -1;
        }
        kvpd_log(KVPD_LOG_INFO, "peer_add", "peer=%s", kvpd_esc(addr).s);
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

/* log_file: stderr (ours, the library's, UCX's) appended to the file;
 * called at start and on SIGHUP, so a rotated file is let go. The new file
 * is opened before the old one is let go: one that cannot be opened (a
 * directory gone, permissions) leaves stderr where it was, so the caller
 * can say why there (issue 27: freopen had closed stderr for good). */
static int log_reopen(const char *path)
{
    if (path[0] == '\0')
        return 0;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0640);
    if (fd < 0)
        return -1;
    fflush(stderr);
    if (fd != STDERR_FILENO && dup2(fd, STDERR_FILENO) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (fd != STDERR_FILENO)
        close(fd);
    setvbuf(stderr, NULL, _IOLBF, 0);
    return 0;
}

/* The effective settings as text, one "name = value" per line. */
static char *settings_text(const kvpd_settings_t *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f == NULL)
        return NULL;
    kvpd_settings_print(s, f);
    fclose(f);
    return buf;
}

/* True if `text` holds `line` as a whole line (not as a prefix of a longer
 * value: "x = 300" is not in "x = 300000"). */
static bool has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; p && (p = strstr(p, line)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && (p[n] == '\n' || p[n] == '\0'))
            return true;
    return false;
}

/* SIGHUP: reopen the log file, then load the settings again (file,
 * environment, flags, as at start). What needs no new memory registration
 * applies at once -- timings, limits, the PSK for new sessions
 * (kvp_node_reconfigure), log_level, new peers -- and every other changed
 * option is named as needing a restart, its running value unchanged. A bad
 * file, or values the node refuses, are refused whole: the running
 * settings stay. */
static void daemon_reload(kvpd_t *d, int argc, char **argv)
{
    if (log_reopen(d->set.log_file) != 0)
        kvpd_log(KVPD_LOG_ERROR, "log_reopen_failed",
                 "path=%s error=\"%s\" note=\"logging on to the file already open\"",
                 kvpd_esc(d->set.log_file).s, strerror(errno));
    kvpd_settings_t n;
    kvpd_settings_init(&n);
    if (kvpd_settings_load(&n, argc, argv, stdout, stderr) != KVPD_LOAD_RUN) {
        kvpd_log(KVPD_LOG_ERROR, "reload_failed",
                 "note=\"bad configuration (see the line above); running settings kept\"");
        kvpd_settings_free(&n);
        return;
    }
    kvp_status_t st = kvp_node_reconfigure(d->node, &n.cfg);
    if (st != KVP_OK) {
        kvpd_log(KVPD_LOG_ERROR, "reload_failed",
                 "error=\"%s\" note=\"refused whole; running settings kept\"",
                 kvpd_escq(kvp_last_error()[0] ? kvp_last_error() : kvp_status_str(st)).s);
        kvpd_settings_free(&n);
        return;
    }
    char *old = settings_text(&d->set), *neu = settings_text(&n);
    char restart[512] = "", applied[512] = "";
    for (char *save = NULL, *l = neu ? strtok_r(neu, "\n", &save) : NULL; l;
         l = strtok_r(NULL, "\n", &save)) {
        size_t k = strcspn(l, " ");
        char name[64];
        if (l[0] == ';' || (old && has_line(old, l)))
            continue; /* unchanged (or a comment) */
        snprintf(name, sizeof(name), "%.*s", (int)k, l);
        char *list = kvpd_option_runtime(name) ? applied : restart;
        snprintf(list + strlen(list), sizeof(restart) - strlen(list), "%s%s", list[0] ? "," : "",
                 name);
    }
    free(old);
    free(neu);
    if (n.psk_len != d->set.psk_len || memcmp(n.psk, d->set.psk, n.psk_len) != 0)
        snprintf(applied + strlen(applied), sizeof(applied) - strlen(applied), "%spsk(new sessions)",
                 applied[0] ? "," : "");
    kvpd_log_set_level(n.log_level);
    char *peers_saved = d->set.peers;
    d->set.peers = n.peers; /* add what is new (kvp_peer_add is idempotent) */
    peers_connect(d);
    d->set.peers = peers_saved;
    kvpd_log(KVPD_LOG_INFO, "reload", "log_level=%s peers=\"%s\" applied=\"%s\"%s%s%s",
             n.log_level_s, n.peers, applied, restart[0] ? " needs_restart=\"" : "", restart,
             restart[0] ? "\"" : "");
    if (restart[0])
        kvpd_log(KVPD_LOG_WARN, "reload_partial",
                 "needs_restart=\"%s\" note=\"these need a restart: running values unchanged\"",
                 restart);
    /* The applied values become the running ones (the next reload compares
     * against them); the rest keep their running values. */
    /* A new log_file that cannot be opened: logged here, in the file
     * already open, and the running log_file stays (the next SIGHUP
     * reopens that one, as logrotate expects). */
    if (strcmp(n.log_file, d->set.log_file) != 0 && log_reopen(n.log_file) != 0) {
        kvpd_log(KVPD_LOG_ERROR, "log_reopen_failed",
                 "path=%s error=\"%s\" note=\"logging on to %s\"", kvpd_esc(n.log_file).s,
                 strerror(errno), d->set.log_file[0] ? kvpd_esc(d->set.log_file).s : "stderr");
        char *keep = n.log_file;
        n.log_file = d->set.log_file;
        d->set.log_file = keep; /* swapped back by keep_runtime below */
    }
    kvpd_settings_keep_runtime(&d->set, &n);
    atomic_store(&d->dead_after_ms, d->set.cfg.dead_after_ms);
    kvpd_settings_free(&n);
}

/* Returns the signal that ended the loop. */
static int main_loop(kvpd_t *d, int sigfd, int argc, char **argv)
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
            if (read(sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
                if (si.ssi_signo != SIGHUP)
                    return (int)si.ssi_signo;
                daemon_reload(d, argc, argv);
            }
        }
        /* Events are also drained on the 1 s tick: a missed wakeup costs
         * at most that, never a hung admin request. */
        kvpd_dispatch(d);
    }
}

static int daemon_start(kvpd_t *d)
{
    atomic_store(&d->dead_after_ms, d->set.cfg.dead_after_ms);
    kvp_status_t st = kvp_node_create(&d->set.cfg, &d->node);
    if (st != KVP_OK) {
        kvpd_log(KVPD_LOG_ERROR, "node_create_failed", "listen=%s status=\"%s\"",
                 d->set.listen, kvp_status_str(st));
        /* a setting the library refused (e.g. issue 27: listen beyond
         * loopback without a psk): exit 2, which the unit does not restart */
        return st == KVP_ERR_INVALID ? -2 : -1;
    }
    kvpd_log(KVPD_LOG_INFO, "node_up",
             "peer=%s num_blocks=%u block_size=%u transport=ucx admin=%d drain_ms=%u",
             kvp_node_peer_id(d->node), d->set.cfg.num_blocks, d->set.cfg.block_size,
             d->set.admin ? 1 : 0, d->set.cfg.shutdown_drain_ms);
    if (peers_connect(d) != 0 || kvpd_dns_start(d) != 0)
        return -1;
    if (d->set.http[0] && kvpd_http_start(d) != 0)
        return -1;
    return ready_file_write(d);
}

static void daemon_stop(kvpd_t *d)
{
    kvpd_dns_stop(d); /* its thread wants peers of the node: gone first */
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
    if (log_reopen(d.set.log_file) != 0) {
        fprintf(stderr, "kvpeerd: log_file %s: %s\n", d.set.log_file, strerror(errno));
        kvpd_settings_free(&d.set);
        return 2;
    }
    kvpd_log_set_level(d.set.log_level);
    if ((sigfd = signals_open()) < 0) {
        kvpd_log(KVPD_LOG_ERROR, "signalfd_failed", "error=\"%s\"", strerror(errno));
        kvpd_settings_free(&d.set);
        return 1;
    }
    pthread_mutex_init(&d.lock, NULL);
    pthread_cond_init(&d.cond, NULL);
    int started = daemon_start(&d);
    if (started == 0) {
        int sig = main_loop(&d, sigfd, argc, argv);
        kvpd_log(KVPD_LOG_INFO, "shutdown", "signal=%s", sig ? strsignal(sig) : "none");
        rc = 0;
    } else if (started == -2) {
        rc = 2;
    }
    daemon_stop(&d);
    pthread_cond_destroy(&d.cond);
    pthread_mutex_destroy(&d.lock);
    close(sigfd);
    kvpd_log(KVPD_LOG_INFO, "exit", "code=%d", rc);
    kvpd_settings_free(&d.set);
    return rc;
}
