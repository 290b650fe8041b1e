package qemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/guestagent/client"
	"github.com/zyvor/kairon/internal/guestagent/wire"
	"github.com/zyvor/kairon/internal/testenv"
)

// dialAgent connects to the guest agent of a running VM. The agent starts
// early in the guest's init, so a Running guest answers soon; Dial itself
// waits for its Hello.
func dialAgent(tb testing.TB, b *Backend, id string) *client.Client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	c, err := client.Dial(ctx, b.AgentSocket(id), client.Options{})
	if err != nil {
		tb.Fatalf("dialing the guest agent of %s: %v\nconsole:\n%s", id, err, lastLines(readTail(b.ConsoleLog(id), 8192), 20))
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func guestExec(t *testing.T, c *client.Client, stdin io.Reader, args ...string) (client.Result, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := c.Exec(context.Background(), &wire.Exec{Args: args}, stdin, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q: %v (stderr %q)", args, err, errb.String())
	}
	return res, out.String(), errb.String()
}

// TestGuestAgent boots the default guest (jailed, as root runs it) and uses
// its agent over the virtio-serial channel: commands, exit codes, 10 MB of
// output, stdin, a 20 MB file both ways, a TTY, configure and ping; then
// saves and restores the VM and runs a command in the restored guest.
func TestGuestAgent(t *testing.T) {
	b := newTestBackend(t, Options{Log: testLogger(t)})
	ctx := context.Background()
	spec := backend.Spec{ID: "ns1_agent", Name: "ns1/agent", CPU: 1, MemoryMiB: 256}
	if _, err := b.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, spec.ID, backend.Running, bootTimeout)
	c := dialAgent(t, b, spec.ID)
	t.Logf("guest agent: %s", c.Agent())

	t.Run("ping", func(t *testing.T) {
		if err := c.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		// The status that made it Running: ready, for this boot.
		st, err := c.Status(ctx)
		m, merr := readMeta(b.dir(spec.ID))
		if err != nil || merr != nil || !st.Ready || len(m.BootNonce) != 32 || st.Boot != m.BootNonce {
			t.Fatalf("status %+v, %v; this boot's nonce %q, %v", st, err, m.BootNonce, merr)
		}
	})
	t.Run("echo", func(t *testing.T) {
		res, out, _ := guestExec(t, c, nil, "echo", "hello", "from", "the", "guest")
		if res.Code != 0 || out != "hello from the guest\n" {
			t.Errorf("got %+v %q", res, out)
		}
	})
	t.Run("exit codes", func(t *testing.T) {
		for _, code := range []int{0, 3} {
			res, out, errs := guestExec(t, c, nil, "sh", "-c", fmt.Sprintf("echo out; echo err >&2; exit %d", code))
			if res.Code != code || out != "out\n" || errs != "err\n" {
				t.Errorf("exit %d: got %+v %q %q", code, res, out, errs)
			}
		}
	})
	t.Run("10 MB of stdout", func(t *testing.T) {
		const size = 10 << 20
		h := sha256.New()
		start := time.Now()
		res, err := c.Exec(ctx, &wire.Exec{Args: []string{"sh", "-c", fmt.Sprintf("yes 0123456789abcdef | head -c %d", size)}}, nil, h, nil)
		if err != nil || res.Code != 0 {
			t.Fatal(res, err)
		}
		t.Logf("10 MiB of stdout in %s", time.Since(start))
		want := sha256.Sum256(bytes.Repeat([]byte("0123456789abcdef\n"), size/17+1)[:size])
		if !bytes.Equal(h.Sum(nil), want[:]) {
			t.Error("stdout checksum differs")
		}
	})
	t.Run("stdin", func(t *testing.T) {
		in := make([]byte, 1<<20)
		for i := range in {
			in[i] = byte(rand.IntN(256))
		}
		_, out, _ := guestExec(t, c, bytes.NewReader(in), "sha256sum")
		if want := fmt.Sprintf("%x  -\n", sha256.Sum256(in)); out != want {
			t.Errorf("the guest's sha256sum of stdin: %q, want %q", out, want)
		}
	})
	t.Run("20 MB file round trip", func(t *testing.T) {
		data := make([]byte, 20<<20)
		for i := range data {
			data[i] = byte(rand.IntN(256))
		}
		sum := sha256.Sum256(data)
		start := time.Now()
		if n, err := c.WriteFile(ctx, "/tmp/big.bin", 0o600, bytes.NewReader(data)); err != nil || n != int64(len(data)) {
			t.Fatalf("wrote %d: %v", n, err)
		}
		t.Logf("20 MiB written in %s", time.Since(start))
		_, out, _ := guestExec(t, c, nil, "sh", "-c", "sha256sum /tmp/big.bin; stat -c %a /tmp/big.bin")
		if want := fmt.Sprintf("%x  /tmp/big.bin\n600\n", sum); out != want {
			t.Errorf("in the guest: %q, want %q", out, want)
		}
		h := sha256.New()
		start = time.Now()
		if n, err := c.ReadFile(ctx, "/tmp/big.bin", h); err != nil || n != int64(len(data)) {
			t.Fatalf("read %d: %v", n, err)
		}
		t.Logf("20 MiB read in %s", time.Since(start))
		if !bytes.Equal(h.Sum(nil), sum[:]) {
			t.Error("read back checksum differs")
		}
		guestExec(t, c, nil, "rm", "/tmp/big.bin")
	})
	t.Run("tty", func(t *testing.T) {
		var out bytes.Buffer
		res, err := c.Exec(ctx, &wire.Exec{Args: []string{"sh", "-c", "tty; stty size"}, TTY: true, Rows: 33, Cols: 101}, nil, &out, nil)
		if err != nil || res.Code != 0 || !strings.HasPrefix(out.String(), "/dev/pts/") || !strings.Contains(out.String(), "33 101") {
			t.Errorf("got %+v %v %q", res, err, out.String())
		}
	})
	t.Run("configure", func(t *testing.T) {
		if err := c.Configure(ctx, &wire.Configure{Hostname: "renamed", DNS: []string{"10.88.0.1"}, Seed: []byte("a seed of this clone's own")}); err != nil {
			t.Fatal(err)
		}
		_, out, _ := guestExec(t, c, nil, "sh", "-c", "hostname; cat /etc/resolv.conf")
		if out != "renamed\nnameserver 10.88.0.1\n" {
			t.Errorf("after configure: %q", out)
		}
	})

	t.Run("agent started again", func(t *testing.T) {
		// An agent that dies is started again by the guest's init. (The
		// host end stays connected to QEMU meanwhile: it learns nothing
		// until it hangs up and dials again.)
		_, old, _ := guestExec(t, c, nil, "pidof", "kairon-guest-agent")
		guestExec(t, c, nil, "sh", "-c", "setsid sh -c 'sleep 1; kill -9 "+strings.TrimSpace(old)+"' </dev/null >/dev/null 2>&1 &")
		c.Close()
		// An attempt that meets the old agent as it dies loses what it
		// sent (the port drops it with its opener) and gives up after a
		// while; the next one meets the new agent.
		testenv.Eventually(t, bootTimeout, "a new agent to answer", func() (bool, string) {
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			c2, err := client.Dial(actx, b.AgentSocket(spec.ID), client.Options{})
			if err != nil {
				t.Logf("dial: %v", err)
				return false, err.Error()
			}
			defer c2.Close()
			var out bytes.Buffer
			if _, err := c2.Exec(actx, &wire.Exec{Args: []string{"pidof", "kairon-guest-agent"}}, nil, &out, nil); err != nil {
				t.Logf("exec: %v", err)
				return false, err.Error()
			}
			return out.Len() > 0 && out.String() != old, "agent pid " + out.String()
		})
	})
	t.Run("reconnect", func(t *testing.T) {
		// A host that hangs up ends its sessions: the program is killed,
		// and the agent serves the next connection. (QEMU serves one
		// client at a time: the first one goes first.)
		c1 := dialAgent(t, b, spec.ID)
		started := make(chan struct{})
		go func() {
			_, _ = c1.Exec(ctx, &wire.Exec{Args: []string{"sh", "-c", "echo started; exec sleep 1000"}}, nil, closeOnWrite(started), nil)
		}()
		<-started
		c1.Close()
		c2 := dialAgent(t, b, spec.ID)
		testenv.Eventually(t, 30*time.Second, "the hung-up session's program to be killed", func() (bool, string) {
			_, out, _ := guestExec(t, c2, nil, "sh", "-c", "ps | grep -c '[s]leep 1000'")
			return out == "0\n", out
		})
	})
	t.Run("after save and restore", func(t *testing.T) {
		c := dialAgent(t, b, spec.ID)
		guestExec(t, c, nil, "sh", "-c", "echo kept > /tmp/kept")
		saved := filepath.Join(t.TempDir(), "vm.state")
		if err := b.Save(ctx, spec.ID, saved); err != nil {
			t.Fatal(err)
		}
		if err := b.Stop(ctx, spec.ID); err != nil {
			t.Fatal(err)
		}
		<-c.Done() // QEMU is gone, and the channel with it
		if _, err := b.Restore(ctx, spec, saved); err != nil {
			t.Fatal(err)
		}
		c2 := dialAgent(t, b, spec.ID)
		if res, out, errOut := guestExec(t, c2, nil, "cat", "/tmp/kept"); out != "kept\n" {
			t.Errorf("restored guest: %q (%+v, stderr %q)", out, res, errOut)
		}
	})

	// Last, since it kills the agent: root in the guest takes the port
	// over and writes garbage into the channel. The host closes the
	// channel and fails the session waiting on it; nothing else happens.
	t.Run("garbage from the guest", func(t *testing.T) {
		c := dialAgent(t, b, spec.ID)
		script := `for p in /sys/class/virtio-ports/*; do [ "$(cat $p/name)" = kairon.agent ] && dev=/dev/${p##*/}; done
pkill -9 -f 'while /sbin/kairon-guest-agent'
kill -9 $(pidof kairon-guest-agent)
while pidof kairon-guest-agent >/dev/null; do usleep 10000; done
yes 'this is no frame' | head -c 1000000 >$dev`
		// The script runs from a file: on a command line, its own text
		// would match the pkill pattern. It runs as the exec's program
		// itself, so the agent dies before it can report an exit (a
		// wrapper that forks, like setsid, would exit first, and under
		// load the agent reported that exit before the kill reached it).
		guestExec(t, c, strings.NewReader(script), "sh", "-c", "cat > /tmp/garbage.sh")
		_, err := c.Exec(ctx, &wire.Exec{Args: []string{"sh", "/tmp/garbage.sh"}}, nil, nil, nil)
		if !errors.Is(err, client.ErrProtocol) {
			t.Fatalf("exec ended with %v, want the channel closed for a protocol violation", err)
		}
		<-c.Done()
		t.Logf("channel closed: %v", c.Err())
		if got, err := b.Get(ctx, spec.ID); err != nil || got.Phase != backend.Running {
			t.Errorf("VM after its guest wrote garbage: %+v %v", got, err)
		}
	})
}

// closeOnWrite is a writer that closes ch at its first write.
func closeOnWrite(ch chan struct{}) io.Writer {
	var once sync.Once
	return writerFunc(func(p []byte) (int, error) {
		once.Do(func() { close(ch) })
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestGuestAgentAfterLiveMigration: the target of a live migration has the
// same agent port, and the guest's agent serves on it.
func TestGuestAgentAfterLiveMigration(t *testing.T) {
	ctx := context.Background()
	p := startLivePair(t, "agentlive")
	c := dialAgent(t, p.source, p.spec.ID)
	guestExec(t, c, nil, "sh", "-c", "echo before > /tmp/agent-before")
	_, sendErr, receiveErr := p.migrate(t, p.spec)
	if err := errors.Join(sendErr, receiveErr); err != nil {
		t.Fatal(err)
	}
	if err := p.source.Stop(ctx, p.spec.ID); err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	c2 := dialAgent(t, p.target, p.spec.ID)
	if _, out, _ := guestExec(t, c2, nil, "cat", "/tmp/agent-before", "/tmp/x"); out != fmt.Sprintf("before\n%d\n", p.token) {
		t.Errorf("migrated guest: %q", out)
	}
}

// TestAgentPortOfOldStates: a state saved before the agent port existed
// (no agentPort in its header) is restored without one, since QEMU loads a
// state only into the devices it was saved from.
func TestAgentPortOfOldStates(t *testing.T) {
	b := &Backend{}
	with := b.args(launchSpec{name: "x", agentPort: true})
	without := b.args(launchSpec{name: "x"})
	if !slices.Contains(with, "virtserialport,bus=agentbus.0,nr=1,chardev=agent,name=kairon.agent") {
		t.Errorf("no agent port in %q", with)
	}
	if strings.Contains(strings.Join(without, " "), "agent") {
		t.Errorf("agent port without asking: %q", without)
	}
	var h saveHeader
	if err := json.Unmarshal([]byte(`{"format":"kairon-qemu-save/v1","id":"a","cpu":1,"memoryMiB":256}`), &h); err != nil || h.AgentPort {
		t.Errorf("old header: %+v %v", h, err)
	}
}

// BenchmarkGuestAgent measures, on one booted guest, the exec round trip
// of `true` (p50/p99 over b.N runs) and file copy throughput both ways
// (one 64 MiB file). `make bench-exec` runs it.
func BenchmarkGuestAgent(b *testing.B) {
	be := newTestBackend(b, Options{})
	ctx := context.Background()
	spec := backend.Spec{ID: "bench_agent", Name: "bench/agent", CPU: 1, MemoryMiB: 512}
	if _, err := be.Start(ctx, spec); err != nil {
		b.Fatal(err)
	}
	waitPhase(b, be, spec.ID, backend.Running, bootTimeout)
	c := dialAgent(b, be, spec.ID)
	// Warm up: the first exec pages the shell in.
	for range 3 {
		if _, err := c.Exec(ctx, &wire.Exec{Args: []string{"true"}}, nil, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		res, err := c.Exec(ctx, &wire.Exec{Args: []string{"true"}}, nil, nil, nil)
		if err != nil || res.Code != 0 {
			b.Fatal(res, err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	b.ReportMetric(float64(pct(0.50).Microseconds())/1000, "ms-p50")
	b.ReportMetric(float64(pct(0.99).Microseconds())/1000, "ms-p99")

	const size = 64 << 20
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(rand.IntN(256))
	}
	start := time.Now()
	if _, err := c.WriteFile(ctx, "/tmp/bench.bin", 0, bytes.NewReader(data)); err != nil {
		b.Fatal(err)
	}
	up := time.Since(start)
	start = time.Now()
	if _, err := c.ReadFile(ctx, "/tmp/bench.bin", io.Discard); err != nil {
		b.Fatal(err)
	}
	down := time.Since(start)
	b.ReportMetric(float64(size)/(1<<20)/up.Seconds(), "MiB/s-write")
	b.ReportMetric(float64(size)/(1<<20)/down.Seconds(), "MiB/s-read")
	b.Logf("%d exec of true: p50 %s p99 %s; 64 MiB file written in %s, read in %s (%s)", len(lat),
		pct(0.5).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond), up.Round(time.Millisecond), down.Round(time.Millisecond), be.Acceleration())
}

// TestGuestAgentConfigureNetwork gives a guest on a tap a new address,
// gateway, hostname and DNS through the agent, as a clone of a saved guest
// would get its own identity, and reaches it at the new address.
func TestGuestAgentConfigureNetwork(t *testing.T) {
	vmPrereqs(t)
	ns := newTestNetns(t)
	const tap = "ktap0"
	ns.ip(t, "tuntap", "add", "dev", tap, "mode", "tap")
	ns.ip(t, "addr", "add", "10.88.0.1/24", "dev", tap)
	ns.ip(t, "link", "set", tap, "up")
	b := newTestBackend(t, Options{NetNS: ns.name, Log: testLogger(t)})
	ctx := context.Background()
	spec := backend.Spec{
		ID: "ns1_conf", Name: "ns1/conf", CPU: 1, MemoryMiB: 256,
		Network: &backend.Network{
			TapName: tap, MAC: "52:54:00:12:34:57",
			Address: netip.MustParsePrefix("10.88.0.5/24"), Gateway: netip.MustParseAddr("10.88.0.1"),
		},
	}
	if _, err := b.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, spec.ID, backend.Running, bootTimeout)
	c := dialAgent(t, b, spec.ID)
	// A second address in the subnet, as a template a user gave one has:
	// deleting the first takes it along, which a single flush reports as
	// a failure.
	if res, _, errOut := guestExec(t, c, nil, "ip", "addr", "add", "10.88.0.6/24", "dev", "eth0"); res.Code != 0 {
		t.Fatalf("adding a second address in the guest: exit %d: %s", res.Code, errOut)
	}
	err := c.Configure(ctx, &wire.Configure{
		Hostname: "clone-2", Addresses: []string{"10.88.0.9/24"}, Gateway: "10.88.0.1",
		DNS: []string{"10.88.0.1"}, Seed: []byte("this clone's own randomness"),
	})
	if err != nil {
		t.Fatal(err)
	}
	_, out, _ := guestExec(t, c, nil, "sh", "-c", "hostname; ip -4 addr show dev eth0 | grep inet; ip route | grep default")
	if !strings.HasPrefix(out, "clone-2\n") || !strings.Contains(out, "10.88.0.9/24") || strings.Contains(out, "10.88.0.5") || strings.Contains(out, "10.88.0.6") ||
		!strings.Contains(out, "default via 10.88.0.1") {
		t.Errorf("guest after configure:\n%s", out)
	}
	if _, echo, err := talkToGuest(t, ns, "10.88.0.9"); err != nil || echo != "ping kairon\n" {
		t.Errorf("guest at its new address: %q %v", echo, err)
	}
}
