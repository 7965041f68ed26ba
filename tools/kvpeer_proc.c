/*
 * kvpeer_proc.c -- the kvpeerd children of `kvpeer demo` / `kvpeer bench`.
 * Every child is registered in a fixed table and leads its own process
 * group; atexit and the fatal-signal handlers SIGCONT+SIGKILL every
 * registered child's group and reap the child, and each child
 * also gets PR_SET_PDEATHSIG so even a SIGKILL of the CLI cannot leave a
 * daemon behind. Children are spawned from the main thread only (the death
 * signal is tied to the spawning thread).
 */
#include "kvpeer_cli.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_CHILDREN 16

extern char **environ;

/* Registered pids; 0 = free. Written by the main thread, read by the signal
 * handler: sig_atomic_t-sized stores of pid_t are atomic on Linux. */
static volatile pid_t g_children[MAX_CHILDREN];
static int g_guard_installed;

static void child_register(pid_t pid)
{
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (g_children[i] == 0) {
            g_children[i] = pid;
            return;
        }
}

static void child_unregister(pid_t pid)
{
    for (int i = 0; i < MAX_CHILDREN; i++)
        if (g_children[i] == pid)
            g_children[i] = 0;
}

void cli_children_kill_all(void)
{
    for (int i = 0; i < MAX_CHILDREN; i++) {
        pid_t p = g_children[i];
        if (p > 0) {
            kill(-p, SIGCONT); /* its process group: helpers it forked too */
            kill(-p, SIGKILL);
            kill(p, SIGCONT);
            kill(p, SIGKILL);
            while (waitpid(p, NULL, 0) < 0 && errno == EINTR) {
            }
            g_children[i] = 0;
        }
    }
}

static void on_fatal_signal(int sig)
{
    cli_children_kill_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

void cli_children_guard(void)
{
    if (g_guard_installed)
        return;
    g_guard_installed = 1;
    atexit(cli_children_kill_all);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGABRT, SIGSEGV};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        sigaction(sigs[i], &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* In the child, between fork and exec: only async-signal-safe calls. */
static void child_exec(char *const argv[], char *const *envp, int logfd, pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setpgid(0, 0); /* own group, so a kill reaches what the child forks */
    if (getppid() != parent)
        _exit(127); /* the parent already died */
    dup2(logfd, STDOUT_FILENO);
    dup2(logfd, STDERR_FILENO);
    int nul = open("/dev/null", O_RDONLY);
    if (nul >= 0)
        dup2(nul, STDIN_FILENO);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_DFL;
    for (int s = 1; s < 32; s++)
        sigaction(s, &sa, NULL);
    execve(argv[0], argv, envp);
    _exit(127);
}

/* environ plus extra entries (extra wins for equal keys). Caller frees the
 * array (not the strings). */
static char **env_merge(char *const extra[])
{
    size_t ne = 0, nx = 0;
    while (environ[ne])
        ne++;
    while (extra && extra[nx])
        nx++;
    char **env = calloc(ne + nx + 1, sizeof(*env));
    if (env == NULL)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < ne; i++) {
        bool shadowed = false;
        for (size_t j = 0; j < nx && !shadowed; j++) {
            size_t kl = strcspn(extra[j], "=");
            shadowed = strncmp(environ[i], extra[j], kl + 1) == 0;
        }
        if (!shadowed)
            env[k++] = environ[i];
    }
    for (size_t j = 0; j < nx; j++)
        env[k++] = extra[j];
    return env;
}

pid_t cli_spawn(char *const argv[], char *const extra_env[], const char *logpath)
{
    cli_children_guard();
    int logfd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logfd < 0)
        return -1;
    char **env = env_merge(extra_env);
    if (env == NULL) {
        close(logfd);
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0)
        child_exec(argv, env, logfd, parent);
    free(env);
    close(logfd);
    if (pid > 0)
        child_register(pid);
    return pid;
}

int cli_wait(pid_t pid, int timeout_ms, int *wstatus)
{
    uint64_t deadline = cli_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) {
            child_unregister(pid);
            if (wstatus)
                *wstatus = r == pid ? st : 0;
            return 1;
        }
        if (cli_now_ns() >= deadline)
            return 0;
        cli_sleep_ms(10);
    }
}

void cli_kill_reap(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(-pid, SIGCONT);
    kill(-pid, SIGKILL);
    kill(pid, SIGCONT);
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
    child_unregister(pid);
}

int cli_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    int port = 0;
    if (fd < 0)
        return 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static int self_dir(char *out, size_t cap)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return -1;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash == NULL)
        return -1;
    *slash = '\0';
    snprintf(out, cap, "%s", exe);
    return 0;
}

int cli_find_sibling(const char *rel, char *out, size_t cap)
{
    char dir[PATH_MAX];
    if (self_dir(dir, sizeof(dir)) != 0)
        return -1;
    int n = snprintf(out, cap, "%s/%s", dir, rel);
    if (n < 0 || (size_t)n >= cap)
        return -1;
    return access(out, X_OK) == 0 ? 0 : -1;
}

void cli_find_kvpeerd(const char *given, char *out, size_t cap)
{
    if (given != NULL && *given != '\0') {
        snprintf(out, cap, "%s", given);
        return;
    }
    if (cli_find_sibling("kvpeerd", out, cap) == 0)
        return;
    /* execve needs a path: search PATH ourselves. */
    const char *path = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", path ? path : "/usr/local/bin:/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, cap, "%s/kvpeerd", d);
        if (access(out, X_OK) == 0)
            return;
    }
    snprintf(out, cap, "kvpeerd");
}
