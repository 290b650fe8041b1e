// Package controlplane runs a real single-host Kubernetes control plane:
// etcd, kube-apiserver and, optionally, kube-controller-manager, as child
// processes built from the project's pinned sources. kairon-local and the
// integration-test harness both use it, so what developers run by hand and
// what tests run against are the same thing.
//
//   - controlplane.go: Start, Stop, and the kubeconfigs of the admin, the
//     controller and each node agent;
//   - process.go, extra_process.go: the child processes and their logs
//     (StartProcess runs another one, such as a Kairon component);
//   - state.go: the data dir's lock and the ports chosen for it;
//   - pki.go: the CA, serving, client and migration (mTLS) certificates;
//   - crds.go, access.go: the CRDs, RBAC rules and admission policies
//     installed from package config.
//
// Everything lives in one data dir, which survives Stop and is reused by the
// next Start:
//
//	lock                          flock held while running; holds the pid
//	config.json                   the API server and etcd ports
//	kubeconfig                    admin kubeconfig, certificates embedded
//	controller-manager.kubeconfig
//	kairon-controller.kubeconfig  kairon-controller's own identity
//	node-<name>.kubeconfig        each node agent's own identity (NodeKubeconfig)
//	pki/                          CA, serving and client certificates, SA keys
//	etcd/                         etcd's data
//	logs/<process>.log            each child's output, appended per run
package controlplane
