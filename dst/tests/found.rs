//! Seeds that found real losses, kept as regression tests. Each failed before its fix (the
//! commit named below) and passes since. Each seed runs a few times: a run of the ordinary
//! build may not replay exactly (tokio's `select!` draws from an unseeded generator unless
//! built with `--cfg tokio_unstable`, see the crate docs), though the seeds tried do.

use fleetwatch_dst::{Options, Storage, replay_command, run};

fn passes(seed: u64, storage: Storage) {
    // The scenarios as they were found: the durable subscriber's process did not crash.
    passes_with(seed, Options { storage, durable_crashes: false, ..Options::default() });
}

fn passes_with(seed: u64, opts: Options) {
    for attempt in 1..=3 {
        let r = run(seed, &opts).unwrap_or_else(|e| panic!("seed {seed} could not run: {e:#}"));
        assert!(
            r.passed(),
            "seed {seed} failed on attempt {attempt} ({}):\n  {}\n  replay: {}",
            r.scenario,
            r.violations.join("\n  "),
            replay_command(seed, &opts)
        );
    }
}

/// Issue 26 break 1: a hub restart stores a resync marker that subscribers read; the agent
/// is killed, an object deleted, a new agent's resync was coalesced into the read marker
/// and the delete never reached anyone.
#[test]
fn seed_32_a_resync_coalesced_into_one_already_read() {
    passes(32, Storage::Memory);
}

/// The subscriber client, after the hub restarted without a data directory: a connection
/// lost before the first ack in the new stream made the next subscribe present no resume
/// point, so the resync-required `*` the hub owed it was never sent again (and a first
/// subscription from `latest` resumed from `latest` again, skipping what came between).
#[test]
fn seed_1051_a_resume_point_kept_until_the_first_ack_in_a_new_stream() {
    passes(1051, Storage::Memory);
}

/// Issue 26 break 4 and what follows from it: the segment log cut at a record boundary
/// after a crash went unnoticed, new records took offsets subscribers had already
/// acknowledged, and a resuming subscriber skipped them or got them as duplicates.
#[test]
fn seeds_151_and_173_a_log_cut_after_a_crash() {
    passes(151, Storage::Disk);
    passes(173, Storage::Disk);
}

/// Issue 26 break 2 on the memory bus: a durable subscriber's process restarted after the
/// in-memory hub restarted; the hub took its name for a new one and placed it at the end,
/// past the deletions it had missed, without a resync. A memory bus now answers every name
/// it does not know as lost.
#[test]
fn seed_5059_a_durable_name_unknown_to_a_restarted_memory_hub() {
    passes_with(5059, Options { storage: Storage::Memory, ..Options::default() });
}

/// A durable registration kept only in memory until the next periodic flush: the hub
/// crashed right after a durable subscriber's first subscription, and the subscriber's
/// next process was placed at `latest` again, past every record it had never read. A
/// registration is now stored before the hub answers it.
#[test]
fn seed_303896_a_durable_registration_lost_in_a_crash() {
    passes_with(303896, Options { storage: Storage::Mixed, ..Options::default() });
}

/// A durable subscriber behind the retention window: the hub sent it one
/// `resync-required` per evicted cluster in hash order, c1's (offset 102) before c3's
/// (101); the subscriber acked 102 and the hub crashed before c3's went out, so the next
/// session started above 101 and c3's evicted changes were lost silently (1 run in 2).
/// Evictions now go out lowest offset first. Runs with the durable crashes it was found
/// with, a few more times than the others since it failed only on some interleavings.
#[test]
fn seed_345219_an_ack_of_one_eviction_passing_another_not_yet_told() {
    let opts = Options { storage: Storage::Disk, ..Options::default() };
    for _ in 0..3 {
        passes_with(345219, opts.clone());
    }
}

fn passes_on_nats(seed: u64) {
    passes_with(seed, Options { storage: Storage::Nats, ..Options::default() });
}

/// Issue 26 break 2 on the NATS bus (hub replicas on the simulation's in-memory
/// JetStream): JetStream restarted empty, the cursor bucket was recreated, and a durable
/// name not found in it was taken for a new one and placed at the end, past what it had
/// missed. Found by these seeds with the `names_lost` answer reverted (`Lookup::New` for
/// every unknown name); the lookup answers `Lookup::Lost` since `8a54ed0`.
#[test]
fn nats_seeds_264_and_339_a_durable_name_lost_with_the_cursor_bucket() {
    passes_on_nats(264);
    passes_on_nats(339);
}

/// Issue 26 break 3 on the NATS bus: a batch partly stored (a replica's link to JetStream
/// cut, a publish ack lost) with a later record of the cluster stored after the lost one;
/// the agent's resend was skipped as duplicates of the later record and the lost changes
/// reached no subscriber. Found by these seeds with the `Fw-Prev` check reverted (every
/// record taken as following its predecessor); fixed by `8970c9a`.
#[test]
fn nats_seeds_25_and_342_a_record_stored_after_a_lost_one() {
    passes_on_nats(25);
    passes_on_nats(342);
}

/// Found when the NATS bus first ran under the simulation: a subscriber moving to a
/// replica whose local tail lagged the stream (its link to JetStream had been cut) had its
/// cursor taken for one beyond the log: `resync-required` `*` and offsets it had
/// acknowledged delivered again. A session now waits for the tail to hold the stream's
/// end before placing the cursor.
#[test]
fn nats_seed_58_a_cursor_from_a_replica_ahead_of_this_one() {
    passes_on_nats(58);
}

/// Found with seed 58: a subscriber moving to a replica that had not yet taken on a stream
/// recreated after JetStream lost its store was placed in the old stream's offsets, below
/// cursors it had acknowledged on a replica that had. A session now waits for the probe
/// to take the new stream on.
#[test]
fn nats_seeds_273_and_376_a_replica_behind_a_recreated_stream() {
    passes_on_nats(273);
    passes_on_nats(376);
}

/// JetStream lost its store while every hub replica was down; the first one back waited
/// `missing_stream_wait` and began a new bus, whose fresh cursor bucket said no durable
/// names were lost, and a durable subscriber process starting again from `latest` was
/// placed at the new bus's end as a new name, past what it had not read: a silent loss. A
/// bus a hub begins after waiting for a missing stream now marks names lost, as a memory
/// bus does: a durable name's first subscription costs one `resync-required` `*`.
#[test]
fn nats_seeds_263_and_490_a_new_bus_after_the_store_was_lost_with_every_replica_down() {
    passes_on_nats(263);
    passes_on_nats(490);
}

/// A second agent process of a cluster appended through another replica while the first
/// kept appending; that replica's link to JetStream was cut, and the publishes its client
/// kept were sent once the link was back, after newer records of the first agent.
/// `Fw-Prev` turned the first late record into `resync-required`, but the late ones after
/// it followed it and put the second agent's older states over newer ones (the rule for
/// late records of the same agent process, 521 and 543, does not cover another's). Every
/// record now also carries the stream's end its publisher knew (`Fw-Known`); one stored
/// after a record of another agent process of its cluster that lies beyond that end is
/// delivered as `resync-required` too.
#[test]
fn nats_seed_172_late_publishes_of_a_second_agent_process() {
    passes_on_nats(172);
}

/// A replica's link to JetStream was cut while it published a batch; the client kept the
/// publishes and sent them once the link was back, after their acks had timed out and the
/// agent had resent them and newer records through another replica. `Fw-Prev` turned the
/// first late record into `resync-required`, but the late ones after it followed it and
/// were delivered as events, an older state over a newer one. A record older than its
/// cluster's latest of the same agent process is now delivered as `resync-required` too.
#[test]
fn nats_seeds_521_and_543_publishes_sent_late_after_a_cut_link() {
    passes_on_nats(521);
    passes_on_nats(543);
}

/// A second agent process's records stored after the first process's latest, correctly
/// chained and sent after it, but carrying older states: its replica took the frames in
/// while its link to JetStream was cut and published them once the link was back, after
/// the second process had died. The first process, alive and idle, never sent those
/// objects again. Every agent session on a shared bus now looks at its cluster's head when
/// told that a head of another process was recorded (decision 0037; each idle timeout
/// before, 0034), and stores a `resync-required` after it. It failed in about 1 run of 4 of
/// the ordinary build, so it runs more often than the others; with the sessions never told
/// (`Session::watching` left out), 7 runs of 10 failed, 0 of 10 with it.
#[test]
fn nats_seed_2928_older_states_of_a_second_process_after_the_first_ones() {
    for _ in 0..3 {
        passes_on_nats(2928);
    }
}

/// A replaced agent session's batch failed on a replica (its link to JetStream cut) while
/// the agent's new session on the same replica had a batch in flight: the failure dropped
/// the replica's chain of publishes for the cluster, so the new session's next batch named
/// the stored head as its predecessor although the batch in flight before it was lost; it
/// followed the head and was delivered as events, and the agent's resend of the lost
/// record was skipped as a duplicate of it. A failed append now leaves the chain's tip in
/// place (marked broken): records continuing past it name it, and only a resend starts
/// again from the stored head.
#[test]
fn nats_seed_4726_a_failed_append_dropping_the_chain_of_one_in_flight() {
    passes_on_nats(4726);
}

/// A session a second agent process had left (it moved to another replica) took one of its
/// records in late, after that process's newer records and the first process's after them:
/// it named the first process's latest record and followed it, though older than what its
/// own process had stored. The tail now remembers the highest seq of the last few agent
/// processes of a cluster, and a record at or below its process's is stale.
#[test]
fn nats_seed_7056_a_record_older_than_its_own_process_behind_another_process() {
    passes_on_nats(7056);
}

/// A replica's local tail started after retention had evicted records of the stream, and
/// the heads bucket (written once a second) did not name a cluster whose latest records
/// were among them: a live subscriber resuming there from before the first retained record
/// was told of the other clusters' evictions but not of that one's. A tail started after
/// evictions now answers a reader from before its first record with `resync-required *`.
#[test]
fn nats_seed_8146_evictions_before_the_tail_started_of_a_cluster_the_heads_did_not_name() {
    passes_on_nats(8146);
}

/// A new bus began under a running replica (JetStream lost its store while another replica
/// restarted); the running one flushed a durable cursor of the old bus into the new bus's
/// cursor bucket before it noticed, and the subscriber resumed at that offset of the new
/// bus, past its first records. Cursor entries now name their bus; one of another bus
/// reads as empty (the name is lost: `resync-required *`). Refusing to write over it, as
/// first done, kept a replica of the new bus from registering the name at all (1593).
#[test]
fn nats_seeds_9866_and_1593_a_cursor_of_the_old_bus_written_into_a_new_one() {
    passes_on_nats(9866);
    passes_on_nats(1593);
}

/// An agent resent a record its replaced session still had in flight on the same replica;
/// the resend was skipped as a duplicate of the publish in flight and acked at once, and
/// that publish was then lost. Resends are now skipped only up to what is known stored
/// (JetStream's duplicate window drops a copy of what was).
#[test]
fn nats_seeds_10074_11367_and_15030_a_resend_acked_while_its_first_publish_was_in_flight() {
    passes_on_nats(10074);
    passes_on_nats(11367);
    passes_on_nats(15030);
}

/// Two hub replicas started together after JetStream had lost its store: both waited for
/// the missing stream, one began a new bus, and the other, finding it, wrote the cursor
/// store's meta entry first saying no durable names were lost; a durable subscriber coming
/// back from `latest` was placed at the new bus's end as a new name. A replica that waited
/// for a missing stream now answers as the one that began the bus did.
#[test]
fn nats_seed_10841_a_replica_finding_a_new_bus_it_waited_for() {
    passes_on_nats(10841);
}

/// JetStream lost its store twice in a short time; a replica that had begun taking the
/// first recreated stream on (it published its marker) lost it again before it recorded
/// the new base, and recreated the stream at that same base: its offsets repeated offsets
/// another replica had handed out of the first recreation, and a durable subscriber got
/// cursors it had acknowledged again. A replica now counts a stream's base as handed out
/// before anything else of taking it on.
#[test]
fn nats_seed_9427_a_stream_recreated_twice_at_one_base() {
    passes_on_nats(9427);
}

/// JetStream lost its store twice within three seconds. A hub replica that had crashed and
/// been started again within the simulation's first second kept the first deployment's
/// zero `missing_stream_wait` through its failing attempts to open the bus, and created a
/// new bus at once when JetStream came back empty the second time, before the running
/// replica could recreate the stream as the continuation of its bus; its cursor store said
/// no durable names were lost, and the durable subscriber's process, started again from
/// `latest`, was placed at the new bus's end as a new name: the changes of both clusters it
/// had not read were lost. The simulation was wrong (no production hub begins a bus
/// without the wait): only the processes started with the simulation skip it now. The hub
/// also closes the race nearby: a replica that finds a new bus at once writes the same
/// meta entry as its creator, who says in the stream's description that it waited.
#[test]
fn nats_seed_15240_a_new_bus_begun_without_the_wait_by_a_restarted_replica() {
    passes_on_nats(15240);
}

/// Seed 2928's case with the first agent process busy instead of idle: a second agent
/// process of c1 appended through a replica whose link to JetStream was cut; its records
/// were stored late, after the first process had deleted o2, and the last of them (sent
/// once the replica knew the stream's end, so not late by `Fw-Known`) carried the second
/// process's older o2. The first process's next record chained onto it before the
/// idle-time head check could answer, so the stale o2 stood. A batch whose first record
/// would follow another agent process's head is now preceded by a `resync-required`. Found
/// in about 1 run of 10-20 of the ordinary build: it runs more times than the others.
#[test]
fn nats_seed_56434_a_batch_chained_onto_another_agent_processs_older_state() {
    for _ in 0..4 {
        passes_on_nats(56434);
    }
}

/// JetStream lost its store three times. A replica recreated the stream at base 2^21 and a
/// durable subscriber acknowledged offsets up to 2,097,157 there; that replica crashed, the
/// store was lost again, and a replica that had never taken that recreation on recreated
/// the stream at the same base: no running replica knew the offsets handed out (unlike
/// 9427). The hub answered the subscriber's cursor as beyond the end of its log with
/// `resync-required` `*` at the log's end, then delivered new records under offsets the
/// subscriber had acknowledged, and the client kept its old ack as its resume point. The
/// client now follows the hub's placement below its ack (only ever after that `*`).
#[test]
fn nats_seed_71972_a_stream_recreated_below_offsets_no_running_replica_knew() {
    passes_with(71972, Options { storage: Storage::Nats, ..Options::default() });
}
