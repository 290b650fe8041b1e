// Package rules holds the decisions Kairon makes in more than one place,
// each decided once, so a user's preview and the controller's action
// cannot differ:
//
//   - disruption.go, refusal.go: the disruption-budget arithmetic and how
//     the MachineMigration webhook words a refusal;
//   - evacuation.go, evacuation_strategy.go, migration.go,
//     migrationpolicy.go: the evacuation plan, the strategy (cold, live,
//     auto) a move takes, conflicting migrations and the MigrationPolicy
//     that governs one;
//   - placement.go, capacity.go, resources.go, scheduled_status.go: placement
//     fit, a node's room, the resources a Machine charges and the status
//     that records a placement;
//   - quota.go, quota_admission.go: quota usage and the admission charges
//     that make parallel creates' quota check atomic;
//   - node_health.go, kairon_node.go, fence.go, fence_snapshots.go: a
//     node's health from its Lease, which Nodes are Kairon's, and fencing;
//   - pool_readiness.go, claim_time.go: when a warm member may be bound, and
//     a claim's creation stamp;
//   - snapshot_restore.go, snapshot_schedule.go: restored Machines' names and
//     SnapshotSchedules' cron;
//   - egress_ceiling.go: EgressWithin, the MCP server's egress ceiling, over
//     package egresspolicy's parsing and matching.
//
// kairon-controller (scheduler, webhooks, budget status, cordon evacuation,
// fencing, snapshots), kairon-node (node health, fencing, snapshots),
// kaironctl (budgets, evacuate, migrate, fence, describe), kairon-ui and
// package ops call the same functions.
//
// The package needs only the API types, apimachinery and a client.Reader:
// no manager, webhook server or metrics, so kaironctl links the rules and
// not the controllers.
package rules
