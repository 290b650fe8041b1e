// Command kairon-local runs Kairon on one machine: a real Kubernetes control
// plane (etcd, kube-apiserver, kube-controller-manager, package
// internal/controlplane) with Kairon's CRDs installed, and kairon-controller,
// the node agents and kairon-ui on top of it, and an OCI registry holding
// the images users start from.
//
//   - main.go: the verbs up, down, node and version;
//   - up.go, down.go: starting everything, and stopping it (VMs saved for
//     resume where they can be);
//   - components.go, kairon_components.go: the Kairon processes run on the
//     control plane, and restarting an agent that died;
//   - node_control.go, node_command.go: `kairon-local node`, stopping,
//     killing and starting one node's agent through a control socket;
//   - procs.go: finding the VM processes and orphans of a data dir;
//   - guest_network.go, guest_network_users.go: the guest network a data dir
//     uses, and which processes still use it;
//   - registry.go, images.go: the registry (Debian's docker-registry, on
//     127.0.0.1:5000 by default, storage in the data dir) and making sure it
//     holds kairon/python:3.11 (package userimages).
//
// See docs/guides/kairon-local.md.
package main
