/*
 * ucx_netdev.c -- which network interface UCX's tcp transport may use
 * (issue 27): the one that carries the control plane's listen address.
 *
 * UCX's tcp transport listens on every interface it is allowed to use, on
 * an ephemeral port, whatever kvpeer's `listen` says; UCX_NET_DEVICES is the
 * only knob. So the AM context gets UCX_NET_DEVICES = the interface whose
 * address is the listen host (127.0.0.1 -> lo). A wildcard listen (0.0.0.0,
 * ::) keeps every interface; the caller says so in a WARN.
 */
#include "transport/ucx_int.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

/* "host:port", "[v6]:port" or a bare host -> host (no brackets). */
static bool ucx_listen_host(const char *listen, char *host, size_t cap)
{
    const char *b = listen, *e;

    if (listen[0] == '[') {
        b = listen + 1;
        e = strchr(b, ']');
        if (e == NULL)
            return false;
    } else {
        e = strrchr(listen, ':');
        if (e == NULL || strchr(listen, ':') != e) /* none, or a bare v6 address */
            e = listen + strlen(listen);
    }
    size_t n = (size_t)(e - b);
    if (n == 0 || n >= cap)
        return false;
    memcpy(host, b, n);
    host[n] = '\0';
    return true;
}

static bool ucx_sa_same(const struct sockaddr *a, const struct sockaddr *b)
{
    if (a == NULL || a->sa_family != b->sa_family)
        return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return false;
}

static bool ucx_sa_any(const struct sockaddr *a)
{
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &in6addr_any,
                      sizeof(in6addr_any)) == 0;
    return false;
}

/* buf = the interface name(s) holding the listen host's address.
 * *all = true (buf "") for a wildcard listen. KVP_ERR_NOT_FOUND when no
 * local interface has it, KVP_ERR_INVALID when it does not parse/resolve. */
kvp_status_t kvp__ucx_net_devices(const char *listen, char *buf, size_t cap, bool *all)
{
    char host[256];
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    struct ifaddrs *ifs = NULL;
    kvp_status_t st = KVP_ERR_NOT_FOUND;

    *all = false;
    if (cap)
        buf[0] = '\0';
    if (listen == NULL || !ucx_listen_host(listen, host, sizeof(host)))
        return KVP_ERR_INVALID;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0 || ai == NULL)
        return KVP_ERR_INVALID;
    if (ucx_sa_any(ai->ai_addr)) {
        *all = true;
        freeaddrinfo(ai);
        return KVP_OK;
    }
    if (getifaddrs(&ifs) != 0) {
        freeaddrinfo(ai);
        return KVP_ERR_TRANSPORT;
    }
    for (struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        if (!ucx_sa_same(i->ifa_addr, ai->ai_addr))
            continue;
        snprintf(buf, cap, "%s", i->ifa_name);
        st = KVP_OK;
        break;
    }
    freeifaddrs(ifs);
    freeaddrinfo(ai);
    return st;
}
