package e2e

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/execstream"
	"github.com/zyvor/kairon/internal/testenv"
)

// BenchmarkExecRoundTrip measures `true` in a real guest, from the request
// to the exit code, through the node agent's exec endpoint and the guest
// agent: in-process over one HTTP/1.1 connection per exec (node-p50/p99),
// and as a user runs it, a bin/kaironctl process each time (kaironctl-p50/
// p99, which includes kaironctl's start and its API lookups). Once per
// run it also copies 64 MiB in and out with bin/kaironctl cp (cp-in-MB/s,
// cp-out-MB/s).
//
//	go test -run '^$' -bench ExecRoundTrip -benchtime 100x ./test/e2e/
func BenchmarkExecRoundTrip(b *testing.B) {
	env := testenv.Get(b)
	ns := env.Namespace(b)
	ctx := context.Background()
	state := b.TempDir()
	b.Cleanup(func() { killVMs(b, state) })
	startController(b, env)
	startAgent(b, env, "bench-exec", state, netns(b))
	deleteNodeAtEnd(b, env, "bench-exec")
	env.KubectlStdin(b, "apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata:\n  name: box\nspec: {}\n", "-n", ns, "apply", "-f", "-")
	m := waitPhase(b, env, client.ObjectKey{Namespace: ns, Name: "box"}, kaironv1.MachineRunning)

	var n corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: m.Spec.NodeName}, &n); err != nil {
		b.Fatal(err)
	}
	address := ""
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			address = net.JoinHostPort(a.Address, strconv.Itoa(int(n.Status.DaemonEndpoints.KubeletEndpoint.Port)))
		}
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Insecure, cfg.CAData, cfg.CAFile = true, nil, ""
	cfg.TLSClientConfig.NextProtos = []string{"http/1.1"}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		b.Fatal(err)
	}
	url := "https://" + address + "/v1/machines/" + ns + "/box/exec"
	params := map[string][]string{"command": {"true"}}
	kaironctl := func(args ...string) {
		b.Helper()
		cmd := exec.Command(filepath.Join(env.BinDir, "kaironctl"), append([]string{"--kubeconfig", env.Kubeconfig, "-n", ns}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("kaironctl %v: %v: %s", args, err, out)
		}
	}

	var direct, viaCLI []time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		conn, err := execstream.Upgrade(ctx, rt, url, params)
		if err != nil {
			b.Fatal(err)
		}
		exit, err := execstream.Run(ctx, conn, execstream.Session{})
		if err != nil || exit.Code != 0 {
			b.Fatalf("true: %+v %v", exit, err)
		}
		direct = append(direct, time.Since(start))
		start = time.Now()
		kaironctl("exec", "box", "--", "true")
		viaCLI = append(viaCLI, time.Since(start))
	}
	b.StopTimer()
	report := func(name string, d []time.Duration) {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		b.ReportMetric(ms(percentile(d, 50)), name+"-p50-ms")
		b.ReportMetric(ms(percentile(d, 99)), name+"-p99-ms")
	}
	report("node", direct)
	report("kaironctl", viaCLI)

	const size = 64 << 20
	dir := b.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, bytes.Repeat([]byte("0123456789abcdef"), size/16), 0o644); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	kaironctl("cp", src, "box:/tmp/bench.bin")
	b.ReportMetric(size/1e6/time.Since(start).Seconds(), "cp-in-MB/s")
	start = time.Now()
	kaironctl("cp", "box:/tmp/bench.bin", filepath.Join(dir, "back"))
	b.ReportMetric(size/1e6/time.Since(start).Seconds(), "cp-out-MB/s")
	if st, err := os.Stat(filepath.Join(dir, "back")); err != nil || st.Size() != size {
		b.Fatalf("cp out: %v %v", st, err)
	}
	b.ReportMetric(0, "ns/op")
}
