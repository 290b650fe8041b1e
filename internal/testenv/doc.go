// Package testenv gives integration tests a real Kubernetes control plane
// with Kairon's CRDs installed: the same etcd, kube-apiserver and
// kube-controller-manager that kairon-local runs (package controlplane),
// from the pinned binaries in bin/.
//
//   - testenv.go: Run and Get, the one control plane of a test package, and
//     Namespace;
//   - wait.go: the wait helpers, waiting on conditions, never on the clock;
//   - background.go: RunInBackground, a manager or agent run for one test;
//   - namespace_objects.go: WatchNamespace, every change to a namespace's
//     objects in order;
//   - migrations.go: RunMigrations, stand-in node agents for migrations;
//   - jsonpath.go, apirequests.go: reading objects as kubectl would, and the
//     API server's request metrics;
//   - console.go, logwriter.go, digest.go: a VM's serial console, logs to
//     the test log, and file digests;
//   - kubectl.go: Kubectl and Env.Kubectl, the pinned kubectl against a
//     cluster, failing the test on an error;
//   - machine_phase.go: Env.WaitMachinePhase, a Machine reaching a phase;
//   - objects.go: Env.Create and Env.SetStatus, objects a test sets up;
//   - manager.go: Env.StartManager, a controller-runtime manager with the
//     test's options, returned once its cache has synced;
//   - registry.go: StartRegistry, a real OCI registry (Debian's
//     docker-registry) on loopback for one test, optionally with basic
//     authentication, and Registry.Push to put images in it;
//   - ociimage.go: BusyboxImage, a small OCI image for guests.
//
// One control plane serves a whole test package. It starts on the first Get,
// so a package whose selected tests never ask for it pays nothing, and Run
// stops it and deletes its temporary data dir after the tests:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }
//
//	func TestSomething(t *testing.T) {
//		env := testenv.Get(t)
//		ns := env.Namespace(t)
//		...
//	}
//
// Tests share the control plane, so each should work in its own namespace
// (Namespace) and not assume it sees only its own cluster-scoped objects.
package testenv
