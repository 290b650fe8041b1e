package qemu

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/guestagent/wire"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestReadyOnlyFromThisBootsAgent boots the default guest with its agent
// wrapped so that it reports the guest ready for another boot (a forged
// kairon.boot): the guest's init still prints the ready marker on the
// console, and the agent says ready, yet the VM stays Booting, since
// neither the console nor another boot's report counts.
func TestReadyOnlyFromThisBootsAgent(t *testing.T) {
	guestDir, _ := vmPrereqs(t)
	b := newTestBackend(t, Options{Log: testLogger(t)})
	ctx := context.Background()
	image := filepath.Join(guestDir, DefaultImage)
	spec := backend.Spec{
		ID: "ns1_forged", Name: "ns1/forged", CPU: 1, MemoryMiB: 256,
		Kernel: filepath.Join(image, "vmlinux"),
		Initrd: forgedBootInitrd(t, filepath.Join(image, "initramfs.cpio.gz")),
	}
	statuses := make(chan wire.Status, 256)
	seen := func(id string, st wire.Status) {
		if id == spec.ID {
			select {
			case statuses <- st:
			default:
			}
		}
	}
	agentStatusSeen.Store(&seen)
	t.Cleanup(func() { agentStatusSeen.Store(nil) })

	if _, err := b.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, bootTimeout, "the guest to print the ready marker on its console", func() (bool, string) {
		found, err := fileContains(b.ConsoleLog(spec.ID), readyMarker)
		return found, fmt.Sprintf("%v\n%s", err, lastLines(readTail(b.ConsoleLog(spec.ID), 8192), 20))
	})
	// A status the watcher got after the marker was printed: the guest's
	// init made the agent's ready file before it printed the marker.
	for len(statuses) > 0 {
		<-statuses
	}
	var last wire.Status
	testenv.Eventually(t, bootTimeout, "the watcher to hear the agent report ready after the marker", func() (bool, string) {
		select {
		case last = <-statuses:
		default:
		}
		return last.Ready, fmt.Sprintf("%+v", last)
	})
	if last.Boot != "forged" {
		t.Fatalf("the agent reported boot %q; the wrapper did not forge it", last.Boot)
	}
	m, err := readMeta(b.dir(spec.ID))
	if err != nil || m.BootNonce == "" || m.BootNonce == "forged" {
		t.Fatalf("this boot's nonce %q, %v", m.BootNonce, err)
	}
	inst, err := b.Get(ctx, spec.ID)
	if err != nil || inst.Phase != backend.Booting {
		t.Fatalf("a guest that only printed the marker and reported another boot: %+v, %v; want Booting", inst, err)
	}
}

// forgedBootInitrd is the guest image's initramfs with a second archive
// appended (the kernel unpacks both, the later one's files winning) that
// replaces /sbin/kairon-guest-agent by a wrapper: it shows the real agent
// (built here) a kernel command line ending in kairon.boot=forged.
func forgedBootInitrd(t *testing.T, initrd string) string {
	t.Helper()
	agentBin := filepath.Join(t.TempDir(), "agent")
	build := exec.Command("go", "build", "-o", agentBin, "./cmd/kairon-guest-agent")
	build.Dir = moduleRoot(t)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the guest agent: %v\n%s", err, out)
	}
	agent, err := os.ReadFile(agentBin)
	if err != nil {
		t.Fatal(err)
	}
	wrapper := `#!/bin/sh
echo "$(cat /proc/cmdline) kairon.boot=forged" >/run/forged-cmdline
mount --bind /run/forged-cmdline /proc/cmdline
exec /sbin/kairon-guest-agent.real "$@"
`
	base, err := os.ReadFile(initrd)
	if err != nil {
		t.Fatal(err)
	}
	var overlay bytes.Buffer
	zw := gzip.NewWriter(&overlay)
	writeNewc(zw, []newcFile{
		{name: "sbin/kairon-guest-agent", mode: 0o100755, data: []byte(wrapper)},
		{name: "sbin/kairon-guest-agent.real", mode: 0o100755, data: agent},
	})
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "initramfs.cpio.gz")
	if err := os.WriteFile(out, append(base, overlay.Bytes()...), 0o644); err != nil {
		t.Fatal(err)
	}
	// The jailed QEMU reads it under its own uid.
	for d := filepath.Dir(out); d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			_ = os.Chmod(d, fi.Mode().Perm()|0o001)
		}
	}
	return out
}

// moduleRoot is the directory of go.mod above the test's.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		t.Fatalf("go env GOMOD: %v %s", err, out)
	}
	return filepath.Dir(string(bytes.TrimSpace(out)))
}

type newcFile struct {
	name string
	mode uint32
	data []byte
}

// writeNewc writes files as a cpio archive in the "newc" format the
// kernel's initramfs unpacker reads, ending with its trailer.
func writeNewc(w interface{ Write([]byte) (int, error) }, files []newcFile) {
	var buf bytes.Buffer
	pad := func() {
		for buf.Len()%4 != 0 {
			buf.WriteByte(0)
		}
	}
	entry := func(ino int, f newcFile) {
		fmt.Fprintf(&buf, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, f.mode, 0, 0, 1, 0, len(f.data), 0, 0, 0, 0, len(f.name)+1, 0)
		buf.WriteString(f.name)
		buf.WriteByte(0)
		pad()
		buf.Write(f.data)
		pad()
	}
	for i, f := range files {
		entry(i+1, f)
	}
	entry(0, newcFile{name: "TRAILER!!!"})
	_, _ = w.Write(buf.Bytes())
}
