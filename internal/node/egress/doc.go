// Package egress enforces MachineNetworkPolicies on a node: it programs
// the rule set compiled from the policies selecting a Machine (a Policy,
// compiled by internal/rules/egresspolicy, which decides what a rule
// means) into nftables at the Machine's tap (Enforcer), answers the
// confined guests' DNS (DNSProxy), teaching the enforcer the addresses of
// allowed names, and checks the server names of allowSNI connections (the
// SNI proxy). docs/guides/egress.md describes the behaviour.
//
// The enforcer programs nf_tables over netlink (github.com/google/nftables,
// netlink.go): Setup, Apply, Remove, Learn and RemoveTables are each one
// batch the kernel commits whole (Repair one per 50 Machines, each Machine
// whole in one), and the reads (what an earlier agent
// left, the drop counters and records, the learned sets the SNI proxy
// checks) are netlink dumps; no process is started on these paths. The
// agent keeps one netlink session into the namespace for its life. The nft
// command is used by the tests only: script_test.go keeps the nft text
// the enforcer once ran, and TestNetlinkMatchesScript checks that the
// batches list as that text does. DefaultRouteInterface still runs `ip
// route`, once at agent start.
package egress
