/* status.c -- kvp_status_str: static text for each status. */
#include "common.h"

KVP_EXPORT const char *kvp_status_str(kvp_status_t status)
{
    switch (status) {
    case KVP_OK: return "ok";
    case KVP_ERR_INVALID: return "invalid argument";
    case KVP_ERR_NOMEM: return "out of memory";
    case KVP_ERR_NOSPACE: return "no slot available";
    case KVP_ERR_EXISTS: return "already exists";
    case KVP_ERR_PENDING: return "pending (being filled)";
    case KVP_ERR_NOT_FOUND: return "not found";
    case KVP_ERR_STALE: return "stale reference";
    case KVP_ERR_STATE: return "illegal state";
    case KVP_ERR_LIMIT: return "limit reached";
    case KVP_ERR_PROTO: return "protocol error";
    case KVP_ERR_IO: return "i/o error";
    case KVP_ERR_TIMEOUT: return "timed out";
    case KVP_ERR_CLOSED: return "closed";
    case KVP_ERR_INCOMPATIBLE: return "incompatible peer";
    case KVP_ERR_AUTH: return "authentication failed";
    case KVP_ERR_TRANSPORT: return "data transport error";
    case KVP_ERR_UNSUPPORTED: return "unsupported";
    case KVP_ERR_CANCELED: return "cancelled";
    case KVP_ERR_CHECKSUM: return "checksum mismatch";
    case KVP_ERR_BUSY: return "busy";
    case KVP_ERR_UNREACHABLE: return "peer unreachable";
    case KVP_ERR_TRUNCATED: return "truncated input";
    }
    return "unknown status";
}
