// Package kaironctl is the kaironctl command line, talking to the
// Kubernetes API server the way kubectl does (same kubeconfig, --context
// and --namespace rules): get (with --watch), describe, create and edit
// budget, delete and scale for Kairon's objects; rollout restart of a
// MachinePool; claim and release on warm pools; evacuate and migrate; restore from a snapshot; fence and recover a
// node; logs, exec, cp and console into a Machine's guest (through the node
// agent); mcp serve, an MCP server for AI agents; and version.
//
// Each verb is one file with a constructor listed in verbs (root.go); the
// kinds the verbs work on are the table in kinds.go, printed by
// printers.go, snapshot.go and migrationpolicy.go, and described beyond
// their JSON by describe_machinepool.go among others. Shared by the verbs:
// args.go and object_args.go (naming objects), clients.go, wait.go
// (waiting on the cluster), refusal.go and unserved.go (telling the API
// server's refusals apart by their status, not their text), zeromatch.go
// (selectors that match no Machine), guest.go (exec, cp and console's
// stream to the node agent). The MCP server is mcp.go, mcp_guest.go and
// mcp_limits.go. Migrate, evacuate and scale run package ops; budgets,
// evacuation plans and describe's numbers come from package rules.
package kaironctl
