package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// --controller-pprof-address reaches kairon-controller as
// -pprof-bind-address, and only a loopback address is accepted: the
// profiles are served without authentication.
func TestControllerPprofAddress(t *testing.T) {
	base := func(pprof string, nodes int) upFlags {
		return upFlags{
			binDir: t.TempDir(), dataDir: t.TempDir(), nodes: nodes, nodeGrace: 40 * time.Second,
			node:            nodeOptions{backend: "sim", leaseRenew: 10 * time.Second},
			controllerPprof: pprof,
		}
	}
	tests := []struct {
		pprof   string
		nodes   int
		wantErr string
	}{
		{pprof: "", nodes: 1},
		{pprof: "127.0.0.1:6060", nodes: 1},
		{pprof: "localhost:6060", nodes: 1},
		{pprof: "[::1]:6060", nodes: 1},
		{pprof: "0.0.0.0:6060", nodes: 1, wantErr: `--controller-pprof-address "0.0.0.0:6060": host "0.0.0.0" is not a loopback address`},
		{pprof: "10.1.2.3:6060", nodes: 1, wantErr: `host "10.1.2.3" is not a loopback address`},
		{pprof: "127.0.0.1", nodes: 1, wantErr: `--controller-pprof-address "127.0.0.1": address 127.0.0.1: missing port`},
		{pprof: "127.0.0.1:http", nodes: 1, wantErr: `port "http" is not a TCP port`},
		{pprof: "127.0.0.1:70000", nodes: 1, wantErr: `port "70000" is not a TCP port`},
		{pprof: "127.0.0.1:6060", nodes: 0, wantErr: "needs kairon-controller, which --nodes 0 does not run"},
	}
	for _, tt := range tests {
		t.Run(tt.pprof+"/"+strings.Repeat("n", tt.nodes), func(t *testing.T) {
			comps, err := components(base(tt.pprof, tt.nodes))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			controller, ok := comps[0].(*process)
			if !ok || controller.name != "kairon-controller" {
				t.Fatalf("first component %#v, want kairon-controller", comps[0])
			}
			at := slices.Index(controller.args, "-pprof-bind-address")
			switch {
			case tt.pprof == "" && at >= 0:
				t.Errorf("kairon-controller args %q turn profiling on without the flag", controller.args)
			case tt.pprof != "" && (at < 0 || at+1 >= len(controller.args) || controller.args[at+1] != tt.pprof):
				t.Errorf("kairon-controller args %q, want -pprof-bind-address %s", controller.args, tt.pprof)
			}
		})
	}
}
