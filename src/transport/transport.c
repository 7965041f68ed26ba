/* transport.c -- backend-independent helpers of the data transport (SPEC §6). */
#include "transport/transport.h"

const char *kvp_data_path_str(kvp_data_path_t p)
{
    switch (p) {
    case KVP_PATH_UNKNOWN:
        return "unknown";
    case KVP_PATH_DIRECT_SHM:
        return "direct-shm";
    case KVP_PATH_AM_SHM:
        return "am-shm";
    case KVP_PATH_AM_TCP:
        return "am-tcp";
    case KVP_PATH_RDMA:
        return "rdma";
    case KVP_PATH_FAKE_FENCEABLE:
        return "fake-fenceable";
    case KVP_PATH_FAKE_UNFENCEABLE:
        return "fake-unfenceable";
    case KVP_PATH_FAKE_AM:
        return "fake-am";
    case KVP_PATH_DIRECT_CMA:
        return "direct-cma";
    }
    return "invalid";
}
