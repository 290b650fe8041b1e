// Command kairon-ui serves Kairon's web dashboard and JSON API
// (/api/v1/...) from an informer cache of the cluster a kubeconfig names;
// with --allow-write, the actions of internal/ui run as the signed-in user.
// main.go calls ui.Main.
//
//	kairon-ui --kubeconfig .kairon/kubeconfig            # http://127.0.0.1:8090
//
// See docs/guides/ui.md.
package main
