/*
 * kvpeer.h -- the one public header of kvpeer, a peer-to-peer KV-cache tier.
 *
 * Conventions (usable from ctypes): every name starts with kvp_, handles are
 * opaque pointers, integers are fixed-width, no macro is part of the API.
 * Every call returns a kvp_status_t; out-parameters are written only on
 * success; a call that returns an error never fires its callback or event.
 */
#ifndef KVPEER_H
#define KVPEER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KVP_BUILDING_LIBRARY)
#define KVP_EXPORT __attribute__((visibility("default")))
#else
#define KVP_EXPORT
#endif

/* One status enum for the whole library: KVP_OK is 0, errors are negative. */
typedef enum kvp_status {
    KVP_OK = 0,
    KVP_ERR_INVALID = -1,      /* bad argument from the caller */
    KVP_ERR_NOMEM = -2,        /* an allocation failed */
    KVP_ERR_NOSPACE = -3,      /* no slot can be had (none free, none evictable) */
    KVP_ERR_EXISTS = -4,       /* the key is already READY */
    KVP_ERR_PENDING = -5,      /* the key is FILLING (someone is writing it) */
    KVP_ERR_NOT_FOUND = -6,    /* no such key, peer, transfer or request */
    KVP_ERR_STALE = -7,        /* a (slot, generation) reference is out of date */
    KVP_ERR_STATE = -8,        /* the object is not in a state that allows this */
    KVP_ERR_LIMIT = -9,        /* a configured limit (pins, sessions, ...) was hit */
    KVP_ERR_PROTO = -10,       /* a peer broke the wire protocol */
    KVP_ERR_IO = -11,          /* a system call failed */
    KVP_ERR_TIMEOUT = -12,     /* a deadline passed */
    KVP_ERR_CLOSED = -13,      /* the session, connection or node is closed */
    KVP_ERR_INCOMPATIBLE = -14,/* the peer's layout, fingerprint or version differs */
    KVP_ERR_AUTH = -15,        /* the peer failed authentication */
    KVP_ERR_TRANSPORT = -16,   /* the data transport reported an error */
    KVP_ERR_UNSUPPORTED = -17, /* the backend or build cannot do this */
    KVP_ERR_CANCELED = -18,    /* the operation was cancelled or aborted */
    KVP_ERR_CHECKSUM = -19,    /* a block's content does not match its checksum */
    KVP_ERR_BUSY = -20,        /* try again later (things still in flight) */
    KVP_ERR_UNREACHABLE = -21, /* the peer is down, on probation or unknown */
    KVP_ERR_TRUNCATED = -22,   /* input ended early (decoder: need more bytes) */
} kvp_status_t;

/* Static English text for a status; never NULL. */
KVP_EXPORT const char *kvp_status_str(kvp_status_t status);

#ifdef __cplusplus
}
#endif
#endif /* KVPEER_H */
