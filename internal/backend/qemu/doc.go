// Package qemu is Kairon's default Backend: one qemu-system-x86_64 process
// per Machine, a microvm booting the guest's uncompressed kernel directly.
//
// Everything about a VM lives in its state directory, StateDir/<id>/ (the
// files are listed in statedir.go), so that a new Backend (a restarted node
// agent) re-adopts what still runs.
//
// QEMU runs in its own session (setsid) with its working directory in
// StateDir/<id>, so it survives the agent and its unix socket paths stay
// short whatever StateDir is.
//
//   - qemu.go: the Backend, Start, Stop and the other operations;
//   - launch.go: QEMU's command line and the guest kernel's, and the process
//     started and reaped;
//   - jail.go, capabilities.go, cgroup.go, hostscope.go: the VM jail (uid,
//     chroot, namespaces, seccomp), QEMU's capability bounding set, the
//     per-VM cgroup, and VMs in the host's cgroups;
//   - accel.go: KVM or TCG, and the probe that decides;
//   - ready.go: readiness through the guest agent, and the console log's cap;
//   - status.go, statedir.go: what a VM is doing, and its state directory;
//   - qmp.go: the minimal QMP client;
//   - save.go, migration.go, live.go, clone.go: saved states, QEMU's
//     migration stream, live migration, and clones of a saved state;
//   - rootimage.go: an image guest's root image, its disk and its SHA-256,
//     which a saved or migrating image guest's target must match;
//   - timer_guard.go: the guest's single clock event device kept ticking.
package qemu
