package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

// version is set at link time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

const usage = `kairon-local runs Kairon on this machine: a real Kubernetes control plane
(etcd, kube-apiserver, kube-controller-manager) with Kairon's CRDs installed.

Usage:
  kairon-local up [flags]    start, and run until Ctrl-C or SIGTERM (which save the VMs;
                             the next 'up' resumes them)
  kairon-local down [flags]  stop the kairon-local of a data dir and every VM it left;
                             --purge also deletes the data dir
  kairon-local node stop|kill|start NODE [flags]
                             take one node of the running kairon-local down (kill: as
                             if its host died) or bring it back
  kairon-local version       print the version
  kairon-local help          print this text

Run 'kairon-local up --help', 'kairon-local down --help' and 'kairon-local node --help'
for their flags.
`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is main without the exit, so the exit code is decided in one place.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "up":
		return up(args[1:], stdout, stderr)
	case "down":
		return down(args[1:], stdout, stderr)
	case "node":
		return nodeCommand(args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, versionString())
		return 0
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "kairon-local: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

func versionString() string {
	v := version
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " (" + s.Value[:12] + ")"
			}
		}
	}
	return fmt.Sprintf("kairon-local %s %s %s/%s", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
