// Package node is kairon-node, the agent that runs the Machines placed on one
// Node: it keeps its Node object and Lease current, starts, stops, suspends
// and polls VMs through a backend, attaches them to the node network,
// enforces their egress policies, moves them to and from other nodes (cold
// and live migration, snapshots, snapshot clones), serves their console and
// exec, and reports their status. New (agent.go) builds one Agent from
// Options (options.go); Run runs it. By concern:
//
//   - the agent: agent.go, options.go, metrics.go (every metric, registered
//     once), health.go (/healthz and /readyz);
//   - machine lifecycle: machine_controller.go (the Machine reconciler,
//     status phase and addresses), boot.go, instance_poller.go, suspend.go,
//     own_writes.go, guest_addresses.go, guest_nameserver.go,
//     guest_agent_ready.go (the GuestAgentReady condition), main_process.go
//     (the MainProcess condition of an image's entrypoint);
//   - OCI images: machine_image.go (a Machine's image on the node before its
//     VM starts, is restored or received; the cache's collection), over
//     package imagepull (background pulls) and internal/images (the cache),
//     pull_credentials.go (pull secrets asked of kairon-controller);
//   - the node object: node_object.go (labels, capacity, conditions), lease.go,
//     rejoin_fence.go (what a fenced node destroys before it rejoins);
//   - migration: migration.go (cold), live_migration.go, migration_state.go
//     (saved states over the migration listener), migration_bind.go,
//     migration_security.go, migration_token.go (the listener's mTLS and
//     one-time tokens);
//   - snapshots: machine_snapshot.go, machine_snapshot_fetch.go (restoring a
//     snapshot of another node), snapshot.go, template_fetch.go (snapshot
//     clones of a pool's template, here or on another node);
//   - egress: egress_controller.go (the policy reconciler over package
//     egress), egress_applied.go, egress_report.go (this node's entry of a
//     policy's status.nodes), egress_metrics.go;
//   - cross-node networking: crossnode_routes.go, crossnode_subnet.go (the
//     Node annotations and subnet of guests across nodes, over package
//     network);
//   - guest access: console_server.go, console_authz.go,
//     console_impersonation.go, console_safety.go (the kubelet-like console
//     endpoint and who may use it), exec_server.go (exec and cp over package
//     execstream).
package node
