/*
 * test_ucx_proof.c -- "same host" is proven, never taken from the peer's
 * word (issue 27, SPEC §9). Solo transports in one process (no child).
 *
 * A consumer whose region is UCX shared memory commits a load from a
 * direct-shm source at FETCH_DONE without seeing the bytes land. The
 * verdict "this source writes straight into my memory" used to come from
 * the host id in the source's own blob: a remote peer claiming our host id
 * had a FETCH_DONE with no write commit whatever the slots held. Now it
 * needs the proof: the source wrote its secret into our probe segment,
 * which only a process sharing our memory can do (ucx_probe.c).
 *
 *   claimant: same host id, but its transports leave out shared memory
 *             (UCX_TLS=tcp), like a remote host that copied our host id: it
 *             cannot write our segment -> landing_required() stays true,
 *             while the release rule stays conservative (not refusable: it
 *             claims it could write directly).
 *   honest:   a same-host node with shared memory: after it imported our
 *             blob -> proven, landing not required.
 *   relayed:  the proof is bound to the control connection (bind_next_peer,
 *             kvp_link_binding): the honest node imported our blob on one
 *             connection (a relay's), we import its blob on another ->
 *             not proven; on the same connection at both ends -> proven;
 *             once the honest node dropped those peers, its marks are gone.
 *
 * Mutation tried: landing_required() answering from the host-id claim
 * (`return !(x->region_kind == REGION_UCX && p->same_host)`) -> the claimant
 * case fails.
 */
#include "testutil.h"
#include "transport/ucx_int.h"
#include "ucx_testlib.h"

#define NB 16u
#define BS 4096u

static const kvp_layout_t g_layout = {NB, BS};

static kvp_xport_t *node(const char *tls, const char *name)
{
    kvp_xport_t *x = ut_xport_new(tls, name);
    void *base = NULL;
    assert_non_null(x);
    assert_int_equal(x->ops->register_region(x, NULL, (size_t)NB * BS, &g_layout, &base), KVP_OK);
    return x;
}

static kvp_xpeer_id_t import_bound(kvp_xport_t *x, kvp_xport_t *from, uint64_t binding)
{
    const void *b;
    size_t len;
    kvp_xpeer_id_t id = 0;
    assert_int_equal(from->ops->local_blob(from, &b, &len), KVP_OK);
    x->ops->bind_next_peer(x, binding);
    assert_int_equal(x->ops->add_peer(x, b, len, &g_layout, &id), KVP_OK);
    return id;
}

static kvp_xpeer_id_t import(kvp_xport_t *x, kvp_xport_t *from)
{
    const void *b;
    size_t len;
    kvp_xpeer_id_t id = 0;
    assert_int_equal(from->ops->local_blob(from, &b, &len), KVP_OK);
    assert_int_equal(x->ops->add_peer(x, b, len, &g_layout, &id), KVP_OK);
    return id;
}

static void test_claim_is_not_proof(void **state)
{
    (void)state;
    kvp_xport_t *me = node("", "consumer");
    kvp_xport_t *claimant = node("tcp", "claimant");
    assert_true(kvp_ucx_region_ucx_allocated(me));
    kvp_xpeer_id_t back = import(claimant, me); /* it has our blob (it tried) */
    kvp_xpeer_id_t c = import(me, claimant);
    assert_true(kvp_ucx_peer_same_host(me, c)); /* it claims our host */
    assert_false(kvp_ucx_peer_proven(me, c));
    assert_true(me->ops->landing_required(me, c));   /* commit needs AM landing */
    assert_false(me->ops->inbound_refusable(me, c)); /* release stays conservative */
    assert_int_equal(me->ops->remove_peer(me, c), KVP_OK);
    assert_int_equal(claimant->ops->remove_peer(claimant, back), KVP_OK);
    assert_int_equal(claimant->ops->close(claimant, true), KVP_OK);
    assert_int_equal(me->ops->close(me, true), KVP_OK);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_shared_memory_is_proof(void **state)
{
    (void)state;
    kvp_xport_t *me = node("", "consumer");
    kvp_xport_t *honest = node("", "honest");
    kvp_xpeer_id_t h = import(me, honest);
    assert_false(kvp_ucx_peer_proven(me, h)); /* it has not seen our blob yet */
    assert_true(me->ops->landing_required(me, h));
    kvp_xpeer_id_t back = import(honest, me); /* writes its proof into our segment */
    assert_true(kvp_ucx_peer_proven(me, h));
    assert_false(me->ops->landing_required(me, h));
    assert_false(me->ops->inbound_refusable(me, h));
    assert_int_equal(kvp_ucx_peer_inbound_path(me, h), KVP_PATH_DIRECT_SHM);
    assert_int_equal(me->ops->remove_peer(me, h), KVP_OK);
    assert_int_equal(honest->ops->remove_peer(honest, back), KVP_OK);
    assert_int_equal(honest->ops->close(honest, true), KVP_OK);
    assert_int_equal(me->ops->close(me, true), KVP_OK);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_relayed_proof_is_not_proof(void **state)
{
    (void)state;
    kvp_xport_t *me = node("", "consumer");
    kvp_xport_t *honest = node("", "honest");
    /* a relay hands our blob to the honest node on its connection 0x1111,
     * and the honest node's blob to us on its connection 0x2222 */
    kvp_xpeer_id_t back = import_bound(honest, me, 0x1111);
    kvp_xpeer_id_t r = import_bound(me, honest, 0x2222);
    assert_true(kvp_ucx_peer_same_host(me, r));
    assert_false(kvp_ucx_peer_proven(me, r));
    assert_true(me->ops->landing_required(me, r));
    /* one connection seen from both ends: proven */
    kvp_xpeer_id_t back2 = import_bound(honest, me, 0x3333);
    kvp_xpeer_id_t h = import_bound(me, honest, 0x3333);
    assert_true(kvp_ucx_peer_proven(me, h));
    assert_false(me->ops->landing_required(me, h));
    assert_false(kvp_ucx_peer_proven(me, r)); /* still: that mark is not its */
    assert_int_equal(me->ops->remove_peer(me, r), KVP_OK);
    assert_int_equal(me->ops->remove_peer(me, h), KVP_OK);
    assert_int_equal(honest->ops->remove_peer(honest, back), KVP_OK);
    assert_int_equal(honest->ops->remove_peer(honest, back2), KVP_OK);
    /* its sessions gone, its marks are taken back: a new import of its blob
     * on that connection finds none (one cell per live session, no more) */
    kvp_xpeer_id_t h2 = import_bound(me, honest, 0x3333);
    assert_false(kvp_ucx_peer_proven(me, h2));
    assert_int_equal(me->ops->remove_peer(me, h2), KVP_OK);
    assert_int_equal(honest->ops->close(honest, true), KVP_OK);
    assert_int_equal(me->ops->close(me, true), KVP_OK);
    KVP_TEST_ASSERT_NO_LEAKS();
}

int main(int argc, char **argv)
{
    (void)argc;
    ut_main_init(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_claim_is_not_proof),
        cmocka_unit_test(test_shared_memory_is_proof),
        cmocka_unit_test(test_relayed_proof_is_not_proof),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
