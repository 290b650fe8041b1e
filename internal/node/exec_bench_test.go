package node

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/qemu"
	"github.com/zyvor/kairon/internal/execstream"
	"github.com/zyvor/kairon/internal/guestagent/wire"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// BenchmarkExecEndpoint splits an exec's round trip between the guest and
// the node: `true` in a real (TCG) guest, alternately through kairon-node's
// exec endpoint (a new TLS connection and upgrade per exec, as kaironctl
// makes one, with the authorization decisions cached as in a running node)
// and straight over the node's open channel to the guest agent (what the
// endpoint itself does once it has decided). Pairs run back to back, so
// the machine's load falls on both alike; node-overhead is the median of
// the pairs' differences.
//
//	go test -run '^$' -bench ExecEndpoint -benchtime 200x ./internal/node/
func BenchmarkExecEndpoint(b *testing.B) {
	host.SkipIfShort(b, "QEMU and the guest image")
	guestDir, ok := qemu.LocateGuestDir()
	if !ok {
		b.Fatalf("guest image not found (%q): run `make guest`", guestDir)
	}
	state, err := os.MkdirTemp("", "kx")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(state) })
	be, err := qemu.New(qemu.Options{StateDir: state, GuestDir: guestDir})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	spec := backend.Spec{ID: "ns_vm", Name: "ns/vm", CPU: 1, MemoryMiB: 256}
	if _, err := be.Start(ctx, spec); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Stop(context.Background(), spec.ID) })
	testenv.Eventually(b, 5*time.Minute, "the guest to boot", func() (bool, string) {
		inst, err := be.Get(ctx, spec.ID)
		if err != nil || inst.Phase == backend.Exited {
			b.Fatalf("the guest did not boot: %+v %v", inst, err)
		}
		return inst.Phase == backend.Running, fmt.Sprintf("%+v", inst)
	})

	a := &Agent{opts: Options{NodeName: "n1", Backend: be}, consoleAuth: newConsoleAuth(execReviewer{})}
	srv := httptest.NewUnstartedServer(a.handler())
	srv.StartTLS()
	b.Cleanup(srv.Close)
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	tr.DisableKeepAlives = true
	rt := bearerOver{token: "runner", rt: tr}
	url := srv.URL + "/v1/machines/ns/vm/exec"
	params := map[string][]string{"command": {"true"}}
	viaNode := func() time.Duration {
		start := time.Now()
		conn, err := execstream.Upgrade(ctx, rt, url, params)
		if err != nil {
			b.Fatal(err)
		}
		exit, err := execstream.Run(ctx, conn, execstream.Session{})
		if err != nil || exit.Code != 0 {
			b.Fatalf("true via the node: %+v %v", exit, err)
		}
		return time.Since(start)
	}
	direct := func() time.Duration {
		c, err := guestChannels.get(ctx, be.AgentSocket(spec.ID))
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		res, err := c.Exec(ctx, &wire.Exec{Args: []string{"true"}}, nil, nil, nil)
		if err != nil || res.Code != 0 {
			b.Fatalf("true over the channel: %+v %v", res, err)
		}
		return time.Since(start)
	}
	viaNode() // the first one fills the decision caches and the channel
	var node, chanOnly, diff []time.Duration
	b.ResetTimer()
	for range b.N {
		n, d := viaNode(), direct()
		node, chanOnly, diff = append(node, n), append(chanOnly, d), append(diff, n-d)
	}
	b.StopTimer()
	for name, d := range map[string][]time.Duration{"node": node, "channel": chanOnly, "node-overhead": diff} {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, name+"-p50-ms")
		b.ReportMetric(float64(d[(len(d)*99)/100].Microseconds())/1000, name+"-p99-ms")
	}
	b.ReportMetric(0, "ns/op")
}

// bearerOver adds a bearer token to every request of rt.
type bearerOver struct {
	token string
	rt    http.RoundTripper
}

func (b bearerOver) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}
