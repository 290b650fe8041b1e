// Package controller holds kairon-controller's control loops and webhooks.
// SetupWithManager (setup.go) registers all of them, so kairon-controller,
// kairon-local and the tests run the same set: 18 reconcilers, three of
// them optional (the MachineMigration controller, capacity booking and
// cordon evacuation). The decisions they share with kaironctl and the
// webhooks are in package rules; the user verbs they share (cordon's
// migrations) in package ops; every status is written through package
// patch. By concern:
//
//   - scheduling: scheduler.go (SchedulerReconciler places Machines on
//     nodes, spec.nodeName and the Scheduled condition), node_pickup.go,
//     snapshot_placement.go (a restored Machine's node), capacity_booking.go
//     (CapacityBookingReconciler, booking pods that show kube-scheduler a
//     Machine's memory), nodehealth_controller.go (NodeHealthReconciler,
//     the nodes' AgentReady and Machines' NodeReachable from the agents'
//     Leases);
//   - sets and pools: machineset_controller.go, machinepool_controller.go,
//     machinepool_snapshot.go (snapshot-clone pools), expectations.go,
//     replica_status.go, replica_health.go, pool_member_events.go,
//     pool_refill_hold.go, pool_status_pacing.go, uid_stamps.go,
//     pool_metrics.go; a pool's OCI image pinned to one digest per
//     template: pool_image.go (resolutions off the reconcile, status.image
//     and the ImageResolved condition), pool_image_pin.go,
//     pool_image_registry.go (RegistryResolver, over images.Resolver: the
//     nodes' rules for registries),
//     pool_image_auth.go (docker-config pull secrets);
//   - image pull secrets: node_pull_secrets.go (NodePullSecretsReconciler:
//     the RBAC letting a node agent read its Machines' pull secrets and no
//     other Secret), pull_credentials.go (PullCredentialsHandler: the
//     same secrets handed over HTTPS to node agents that share one
//     ServiceAccount, known by their Pod-bound token);
//   - claims: machineclaim_binder.go (MachineClaimBinder binds claims to
//     warm members), machineclaim_controller.go (MachineClaimReconciler),
//     assume.go, bind_tracker.go, bind_events.go, claim_node_health.go,
//     claim_egress.go (a claim's egress policy, and PolicyMachinesReconciler
//     counting a MachineNetworkPolicy's Machines), claim_egress_enforced.go
//     (ClaimEgressEnforcedReconciler), policy_waiters.go;
//   - migration, cordon and fencing: machinemigration_controller.go (picks
//     a target and a MigrationPolicy, holds a migration Pending while the
//     policy's limits are taken, follows it while the node agents move the
//     guest, cold or live), migration_endpoint.go (the Nodes' migration
//     endpoint annotation), migration_metrics.go, cordon.go
//     (CordonEvacuationReconciler: strategy cold, or auto: live where the
//     Machine and both nodes can), fence_controller.go, fence_migrations.go,
//     fence_restore.go (FenceReconciler: a fenced node's Machines, claims
//     and migrations);
//   - snapshots: snapshot_controller.go (MachineSnapshotReconciler hands a
//     snapshot to its Machine's node), snapshot_schedule_controller.go
//     (SnapshotScheduleReconciler);
//   - quotas and budgets: machinequota_controller.go,
//     machinedisruptionbudget_controller.go;
//   - webhooks: webhook_machine.go, webhook_machine_match.go,
//     webhook_migration.go, webhook_policy_status.go (node agents' reports in
//     a MachineNetworkPolicy's status.nodes), seen_machines.go;
//   - metrics: metrics.go (every metric, registered once), metrics_serving.go;
//   - shared plumbing: single_pass.go (controllers whose queue holds one
//     key), event_filters.go, machine_indexes.go.
package controller
