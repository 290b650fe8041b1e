// Command kairon-controller runs Kairon's control loops against a
// Kubernetes API server: every reconciler internal/controller's
// SetupWithManager registers (scheduler, sets, pools and claims,
// migrations and cordon evacuation, snapshots, quotas, budgets, network
// policies) and, with -webhook, the admission webhooks (Machines,
// MachineMigrations, node agents' MachineNetworkPolicy status reports).
// main.go only parses flags and starts the manager.
//
//	kairon-controller -kubeconfig .kairon/kubeconfig
package main
