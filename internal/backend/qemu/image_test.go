package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/guestagent/client"
	"github.com/zyvor/kairon/internal/guestagent/wire"
	"github.com/zyvor/kairon/internal/imagefs"
	"github.com/zyvor/kairon/internal/testenv"
)

// agentRun runs e through c and returns its exit and output; a session
// that fails (not a program that fails) fails the test.
func agentRun(t *testing.T, c *client.Client, e *wire.Exec) (client.Result, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := c.Exec(context.Background(), e, nil, &out, &errb)
	if err != nil {
		t.Fatalf("exec %+v: %v (stderr %q)", e, err, errb.String())
	}
	return res, out.String(), errb.String()
}

// agentRunFails runs e through c, which must fail to start it, and returns
// the guest's reason.
func agentRunFails(t *testing.T, c *client.Client, e *wire.Exec) *client.ExitError {
	t.Helper()
	res, err := c.Exec(context.Background(), e, nil, io.Discard, io.Discard)
	var ee *client.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("exec %+v: %+v, %v; want the guest's refusal", e, res, err)
	}
	return ee
}

// TestImageGuestBusybox boots an image with busybox, a user and a config
// (Env, WorkingDir, User), jailed: exec runs in the image with the
// config's defaults, which a request's Env, Dir and User override; cp
// works both ways inside the image and cannot be led out of it by a
// symlink; the identity files, /tmp and the mounts are as the guest's
// init makes them; the root is writable (the overlay), and the image file
// is unchanged after.
func TestImageGuestBusybox(t *testing.T) {
	guestDir, _ := vmPrereqs(t)
	cfg := imagefs.Config{
		Env:        []string{"PATH=/usr/local/bin:/bin", "GREETING=from-image", "OVERRIDE=image"},
		WorkingDir: "/srv/app",
		User:       "app",
	}
	img := busyboxImage(t, guestDir, cfg,
		// What init and the agent must replace or stay inside of.
		imageEntry{name: "etc/resolv.conf", link: "/run/systemd/resolve/stub-resolv.conf"},
		imageEntry{name: "etc/hostname", mode: 0o644, body: []byte("from-the-image\n")},
		imageEntry{name: "proc", link: "/etc"},
		imageEntry{name: "escape", link: "/init"},
		imageEntry{name: "up", link: "../../../../../../sbin"},
	)
	before := fileSum(t, img)
	b := newTestBackend(t, Options{Log: testLogger(t)})
	ctx := context.Background()
	spec := backend.Spec{ID: "img_bb", Name: "img/bb", CPU: 1, MemoryMiB: 256, RootImage: img,
		KernelArgs: []string{"kairon.dns=192.0.2.53"}}
	if _, err := b.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	inst := waitPhase(t, b, spec.ID, backend.Running, bootTimeout)
	t.Logf("the image guest was ready %s after it started (%s)", inst.ReadyAfter, b.Acceleration())
	c := dialAgent(t, b, spec.ID)

	t.Run("defaults", func(t *testing.T) {
		_, id, _ := agentRun(t, c, &wire.Exec{Args: []string{"id"}})
		_, pwd, _ := agentRun(t, c, &wire.Exec{Args: []string{"pwd"}})
		_, env, _ := agentRun(t, c, &wire.Exec{Args: []string{"env"}})
		if id != "uid=1000(app) gid=1000(app) groups=50(staff)\n" && id != "uid=1000(app) gid=1000(app) groups=1000(app),50(staff)\n" {
			t.Errorf("id: %q, want the config's user app with its groups", id)
		}
		if pwd != "/srv/app\n" {
			t.Errorf("pwd: %q, want the config's WorkingDir (which the image lacked)", pwd)
		}
		for _, want := range []string{"PATH=/usr/local/bin:/bin", "GREETING=from-image", "OVERRIDE=image", "HOME=/home/app"} {
			if !slices.Contains(strings.Split(env, "\n"), want) {
				t.Errorf("env lacks %s:\n%s", want, env)
			}
		}
		if strings.Contains(env, "TERM=") {
			t.Errorf("env without a TTY has TERM:\n%s", env)
		}
	})
	t.Run("overrides", func(t *testing.T) {
		e := &wire.Exec{Env: []string{"OVERRIDE=request", "EXTRA=1"}, Dir: "/tmp", User: "0:0"}
		e.Args = []string{"id"}
		_, id, _ := agentRun(t, c, e)
		e.Args = []string{"pwd"}
		_, pwd, _ := agentRun(t, c, e)
		e.Args = []string{"env"}
		_, env, _ := agentRun(t, c, e)
		if !strings.HasPrefix(id, "uid=0(root) gid=0(root)") || pwd != "/tmp\n" {
			t.Errorf("id %q, pwd %q: want root in /tmp", id, pwd)
		}
		lines := strings.Split(env, "\n")
		for _, want := range []string{"OVERRIDE=request", "EXTRA=1", "GREETING=from-image", "HOME=/root"} {
			if !slices.Contains(lines, want) {
				t.Errorf("env lacks %s:\n%s", want, env)
			}
		}
		_, id, _ = agentRun(t, c, &wire.Exec{Args: []string{"id"}, User: "4321"})
		if !strings.HasPrefix(id, "uid=4321 gid=0(root)") {
			t.Errorf("a uid the image does not know: %q", id)
		}
		_, id, _ = agentRun(t, c, &wire.Exec{Args: []string{"id"}, User: "app:staff"})
		if id != "uid=1000(app) gid=50(staff) groups=50(staff)\n" {
			t.Errorf("app:staff: %q", id)
		}
		if ee := agentRunFails(t, c, &wire.Exec{Args: []string{"id"}, User: "nobody"}); ee.Code != 126 || !strings.Contains(ee.Reason, `user "nobody": no such user in the image's /etc/passwd`) {
			t.Errorf("an unknown user: %+v", ee)
		}
	})
	t.Run("identity files and mounts", func(t *testing.T) {
		_, out, errOut := agentRun(t, c, &wire.Exec{User: "0", Args: []string{"sh", "-c",
			"cat /etc/hostname /etc/hosts /etc/resolv.conf; stat -c '%F %a' /etc/resolv.conf /tmp /proc; hostname; " +
				"grep -c . /proc/self/mountinfo >/dev/null && awk '{print $5, $(NF-2)}' /proc/self/mountinfo"}})
		t.Logf("in the image:\n%s%s", out, errOut)
		for _, want := range []string{
			"bb\n127.0.0.1\tlocalhost\n", "127.0.1.1\tbb\n", "nameserver 192.0.2.53\n",
			"regular file 644\n", "directory 1777\n", "directory 555\n", "\nbb\n",
			"/proc proc\n", "/sys sysfs\n", "/dev devtmpfs\n", "/dev/pts devpts\n", "/dev/shm tmpfs\n", "/run tmpfs\n", "/ overlay\n",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("the image lacks %q", want)
			}
		}
	})
	t.Run("tty", func(t *testing.T) {
		var out bytes.Buffer
		res, err := c.Exec(ctx, &wire.Exec{Args: []string{"sh", "-c", "tty; test -c \"$(tty)\" && echo $TERM; stat -c %U \"$(tty)\""}, TTY: true}, nil, &out, nil)
		if err != nil || res.Code != 0 || !regexp.MustCompile(`^/dev/pts/\d+\r\nxterm\r\napp\r\n$`).MatchString(out.String()) {
			t.Errorf("a TTY in the image: %+v %v %q", res, err, out.String())
		}
	})
	t.Run("cp", func(t *testing.T) {
		data := make([]byte, 3<<20)
		for i := range data {
			data[i] = byte(rand.IntN(256))
		}
		if _, err := c.WriteFile(ctx, "/home/app/in.bin", 0o640, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		// As the image's user, whose file it is.
		_, out, _ := agentRun(t, c, &wire.Exec{Args: []string{"sh", "-c", "stat -c '%a %U:%G %s' in.bin; cmp in.bin /home/app/in.bin && echo same"}, Dir: "/home/app"})
		if out != fmt.Sprintf("640 app:app %d\nsame\n", len(data)) {
			t.Errorf("in the image after cp in: %q", out)
		}
		var back bytes.Buffer
		if _, err := c.ReadFile(ctx, "/home/app/in.bin", &back); err != nil || !bytes.Equal(back.Bytes(), data) {
			t.Errorf("cp out: %d bytes, %v", back.Len(), err)
		}
		back.Reset()
		if _, err := c.ReadFile(ctx, "/etc/hostname", &back); err != nil || back.String() != "bb\n" {
			t.Errorf("cp out of /etc/hostname: %q %v", back.String(), err)
		}
		// /escape -> /init, /up -> ../../../sbin: the initramfs has both,
		// the image neither.
		for _, p := range []string{"/escape", "/up/kairon-guest-agent"} {
			back.Reset()
			if _, err := c.ReadFile(ctx, p, &back); err == nil || !strings.Contains(err.Error(), "no such file") {
				t.Errorf("cp out of %s, a symlink out of the image: %d bytes, %v", p, back.Len(), err)
			}
		}
		if _, err := c.WriteFile(ctx, "/up/planted", 0o644, strings.NewReader("x")); err == nil {
			t.Error("cp in through a symlink out of the image succeeded")
		}
		if _, err := os.Stat("/sbin/planted"); err == nil {
			t.Error("/sbin/planted on the host!")
		}
	})
	t.Run("writable root", func(t *testing.T) {
		_, out, errOut := agentRun(t, c, &wire.Exec{User: "0", Args: []string{"sh", "-c", "echo new > /bin/busybox-was-here && rm /etc/passwd && cat /bin/busybox-was-here && ls /etc/passwd"}})
		if out != "new\n" || !strings.Contains(errOut, "No such file") {
			t.Errorf("writing the image's root: %q %q", out, errOut)
		}
	})
	if err := b.Stop(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if fileSum(t, img) != before {
		t.Error("the root image changed")
	}
}

// helloSrc is a static program for an image with no shell: "report" prints
// who and where it runs, "main" greets the console and exits 3.
const helloSrc = `package main

import (
	"fmt"
	"os"
	"sort"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "main" {
		fmt.Println("hello from the main process")
		os.Exit(3)
	}
	wd, _ := os.Getwd()
	env := os.Environ()
	sort.Strings(env)
	fmt.Printf("uid=%d gid=%d cwd=%s\n", os.Getuid(), os.Getgid(), wd)
	for _, e := range env {
		fmt.Println(e)
	}
}
`

var helloOutput = regexp.MustCompile(`hello from the main process`)

// TestImageGuestWithoutShell boots an image holding one static program and
// nothing else (no shell, no /etc): exec of it works as the config's
// numeric user; exec of sh fails, clearly. The program is also the image's
// main process: it prints to the console and exits 3, which the agent's
// status reports; an agent started again does not run it again.
func TestImageGuestWithoutShell(t *testing.T) {
	vmPrereqs(t)
	prog := staticProgram(t, helloSrc)
	cfg := imagefs.Config{
		Env:        []string{"PATH=/app", "MODE=static"},
		WorkingDir: "/data",
		User:       "4242:4343",
		Entrypoint: []string{"/app/hello"},
		Cmd:        []string{"main"},
	}
	img := buildRootImage(t, cfg, []imageEntry{
		{name: "app", dir: true, mode: 0o755},
		{name: "app/hello", mode: 0o755, body: prog},
	})
	b := newTestBackend(t, Options{Log: testLogger(t)})
	ctx := context.Background()
	spec := backend.Spec{ID: "img_noshell", Name: "img/noshell", CPU: 1, MemoryMiB: 256, RootImage: img}
	if _, err := b.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, spec.ID, backend.Running, bootTimeout)
	c := dialAgent(t, b, spec.ID)

	res, out, _ := agentRun(t, c, &wire.Exec{Args: []string{"hello", "report"}})
	if res.Code != 0 || !strings.HasPrefix(out, "uid=4242 gid=4343 cwd=/data\n") || !strings.Contains(out, "\nMODE=static\n") ||
		!strings.Contains(out, "\nHOME=/\n") || !strings.Contains(out, "\nPATH=/app\n") {
		t.Errorf("hello report: %+v\n%s", res, out)
	}
	res, out, _ = agentRun(t, c, &wire.Exec{Args: []string{"/app/hello", "report"}, User: "0"})
	if res.Code != 0 || !strings.HasPrefix(out, "uid=0 gid=0 cwd=/data\n") || !strings.Contains(out, "\nHOME=/root\n") {
		t.Errorf("/app/hello report as root: %+v\n%s", res, out)
	}
	if ee := agentRunFails(t, c, &wire.Exec{Args: []string{"sh", "-c", "true"}}); ee.Code != 127 || !strings.Contains(ee.Reason, `"sh": no such program in the image's PATH (/app)`) {
		t.Errorf("sh in an image without one: %+v", ee)
	}
	if ee := agentRunFails(t, c, &wire.Exec{Args: []string{"/bin/sh"}}); ee.Code != 127 || !strings.Contains(ee.Reason, "/bin/sh: no such program in the image") {
		t.Errorf("/bin/sh in an image without one: %+v", ee)
	}

	// The main process.
	var st wire.Status
	testenv.Eventually(t, 30*time.Second, "the main process to have exited", func() (bool, string) {
		var err error
		st, err = c.Status(ctx)
		return err == nil && st.Main != nil && st.Main.State == wire.MainExited, fmt.Sprintf("%+v %v", st.Main, err)
	})
	if *st.Main != (wire.MainProcess{State: wire.MainExited, ExitCode: 3}) || !st.Ready {
		t.Errorf("status %+v, main %+v: want ready, main exited with 3", st, st.Main)
	}
	console := func() string {
		b, _ := os.ReadFile(b.ConsoleLog(spec.ID))
		return string(b)
	}
	if n := len(helloOutput.FindAllString(console(), -1)); n != 1 {
		t.Fatalf("the main process's output %d times on the console:\n%s", n, console())
	}

	// The agent started again (its init does that when it ends) does not
	// run the main process again, and still reports its end.
	c.Close()
	con := testenv.DialConsole(t, b.ConsoleSocket(spec.ID)).WithLogs(b.ConsoleLog(spec.ID))
	con.ExpectText(t, "kill $(pidof kairon-guest-agent) && echo agent-$((1+1))-killed", "agent-2-killed", 30*time.Second)
	// A Hello sent while no agent read the port is lost: dial until the
	// new agent answers, as the node's readiness watcher does.
	var c2 *client.Client
	testenv.Eventually(t, bootTimeout, "the agent started again to answer", func() (bool, string) {
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		var err error
		c2, err = client.Dial(dctx, b.AgentSocket(spec.ID), client.Options{})
		return err == nil, fmt.Sprint(err)
	})
	t.Cleanup(func() { c2.Close() })
	st2, err := c2.Status(ctx)
	if err != nil || st2.Main == nil || *st2.Main != *st.Main {
		t.Errorf("status from the agent started again: %+v %v", st2, err)
	}
	con.ExpectText(t, "echo agents-$(pidof kairon-guest-agent | wc -w)", "agents-1", 30*time.Second)
	if n := len(helloOutput.FindAllString(console(), -1)); n != 1 {
		t.Errorf("the main process's output %d times on the console after the agent's restart", n)
	}
}

// TestImageGuestSaveRestoreAndMigrate: an image guest's file written to
// its overlay (guest memory) survives a save and restore onto another
// Backend, then a live migration to a third, and a clone of it there
// takes its own hostname in the image's identity files. A restore without
// the root image, or with another one, is refused.
func TestImageGuestSaveRestoreAndMigrate(t *testing.T) {
	guestDir, _ := vmPrereqs(t)
	img := busyboxImage(t, guestDir, imagefs.Config{})
	ctx := context.Background()
	first := newTestBackend(t, Options{Log: testLogger(t)})
	spec := backend.Spec{ID: "img_moved", Name: "img/moved", CPU: 1, MemoryMiB: 256, RootImage: img}
	if _, err := first.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, first, spec.ID, backend.Running, bootTimeout)
	token := fmt.Sprint(rand.IntN(1_000_000) + 1000)
	c := dialAgent(t, first, spec.ID)
	if _, err := c.WriteFile(ctx, "/root/token", 0o600, strings.NewReader(token)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	saved := filepath.Join(shortTempDir(t), "img.state")
	if err := first.Save(ctx, spec.ID, saved); err != nil {
		t.Fatal(err)
	}
	if err := first.Stop(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}

	second := newTestBackend(t, Options{Log: testLogger(t)})
	without := spec
	without.RootImage = ""
	if _, err := second.Restore(ctx, without, saved); err == nil || !strings.Contains(err.Error(), "booted an OCI image (a root image), and the spec to restore it into has none") {
		t.Errorf("restore without the root image: %v", err)
	}
	other := spec
	other.RootImage = busyboxImage(t, guestDir, imagefs.Config{WorkingDir: "/elsewhere"}, imageEntry{name: "big", mode: 0o644, body: bytes.Repeat([]byte{1}, 1<<20)})
	if _, err := second.Restore(ctx, other, saved); err == nil || !strings.Contains(err.Error(), "is not the image the VM was saved with") {
		t.Errorf("restore with another root image: %v", err)
	}
	if _, err := second.Get(ctx, spec.ID); err == nil {
		t.Error("a refused restore left an instance")
	}
	if inst, err := second.Restore(ctx, spec, saved); err != nil || inst.Phase != backend.Running {
		t.Fatalf("restore: %+v %v", inst, err)
	}
	readToken := func(b *Backend, where string) {
		t.Helper()
		c := dialAgent(t, b, spec.ID)
		defer c.Close()
		var got bytes.Buffer
		if _, err := c.ReadFile(ctx, "/root/token", &got); err != nil || got.String() != token {
			t.Errorf("%s: /root/token %q %v, want %q", where, got.String(), err, token)
		}
		_, out, _ := agentRun(t, c, &wire.Exec{Args: []string{"sh", "-c", "cat /root/token; echo; head -c 4 /bin/busybox | od -c | head -1"}})
		if !strings.HasPrefix(out, token+"\n") || !strings.Contains(out, "E   L   F") {
			t.Errorf("%s: in the image %q", where, out)
		}
	}
	readToken(second, "restored")

	p := &livePair{source: second, target: newTestBackend(t, Options{Log: testLogger(t)}), spec: spec}
	if _, sendErr, receiveErr := p.migrate(t, spec); sendErr != nil || receiveErr != nil {
		t.Fatal(sendErr, receiveErr)
	}
	if err := second.Stop(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	readToken(p.target, "migrated")

	// A clone of it takes its own name in the image too.
	template := filepath.Join(shortTempDir(t), "template.state")
	if err := p.target.Save(ctx, spec.ID, template); err != nil {
		t.Fatal(err)
	}
	clones := newTestBackend(t, Options{Log: testLogger(t)})
	clone := backend.Spec{ID: "img_clone", Name: "img/clone-a", CPU: 1, MemoryMiB: 256, RootImage: img}
	if _, err := clones.RestoreClone(ctx, clone, template); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, clones, clone.ID, backend.Running, bootTimeout)
	cc := dialAgent(t, clones, clone.ID)
	_, out, _ := agentRun(t, cc, &wire.Exec{Args: []string{"sh", "-c", "hostname; cat /etc/hostname /root/token; echo; grep clone-a /etc/hosts"}})
	if out != "clone-a\nclone-a\n"+token+"\n127.0.1.1\tclone-a\n" {
		t.Errorf("the clone's image: %q", out)
	}
}

// The root image's disk comes after every other device (their transports
// do not move), read-only, by path or, jailed, through a descriptor set;
// the guest learns of it from the command line, after the spec's own
// arguments.
func TestRootImageArgs(t *testing.T) {
	b := &Backend{}
	args := b.args(launchSpec{name: "x", agentPort: true, net: &backend.Network{TapName: "t0"}, rootImage: "/var/lib/kairon/images/a,b.sqfs"})
	joined := strings.Join(args, " ")
	drive := slices.Index(args, "if=none,id=rootimg,format=raw,read-only=on,file=/var/lib/kairon/images/a,,b.sqfs")
	dev := slices.Index(args, "virtio-blk-device,drive=rootimg")
	nic := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "virtio-net-device") })
	port := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "virtserialport") })
	if drive < 0 || dev < 0 || dev < nic || dev < port || strings.Contains(joined, "add-fd") {
		t.Errorf("root image by path: %q", args)
	}
	jailed := b.args(launchSpec{name: "x", agentPort: true, rootImage: "/img", rootImageFD: 5, jail: &jailRecord{}})
	if !slices.Contains(jailed, "fd=5,set=1,opaque=root-image") || !slices.Contains(jailed, "if=none,id=rootimg,format=raw,read-only=on,file=/dev/fdset/1") ||
		strings.Contains(strings.Join(jailed, " "), "/img") {
		t.Errorf("jailed root image: %q", jailed)
	}
	if none := strings.Join(b.args(launchSpec{name: "x", agentPort: true}), " "); strings.Contains(none, "rootimg") {
		t.Errorf("a disk without a root image: %q", none)
	}
}

// A saved image guest is restored only with a root image of the same
// content (SHA-256), and a saved built-in guest only without one.
func TestSaveHeaderRootImage(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	if err := os.WriteFile(img, bytes.Repeat([]byte{7}, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	copyOf := filepath.Join(dir, "copy")
	if err := os.WriteFile(copyOf, bytes.Repeat([]byte{7}, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	// Same size, one byte differs: another image.
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, append(bytes.Repeat([]byte{7}, 8191), 8), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := rootImageSum(img)
	if err != nil || len(sum) != 64 {
		t.Fatalf("rootImageSum: %q %v", sum, err)
	}
	shape := saveHeader{Format: saveFormat, CPU: 1, MemoryMiB: 256}
	withImage := shape
	withImage.RootImage, withImage.RootImageSHA256 = true, sum
	spec := func(root string) backend.Spec { return backend.Spec{ID: "a", CPU: 1, MemoryMiB: 256, RootImage: root} }
	for _, tc := range []struct {
		name string
		h    saveHeader
		spec backend.Spec
		want string // "" accepts
	}{
		{"built-in into built-in", shape, spec(""), ""},
		{"image into the same image", withImage, spec(img), ""},
		{"image into a copy of it", withImage, spec(copyOf), ""},
		{"image into none", withImage, spec(""), "booted an OCI image (a root image), and the spec to restore it into has none"},
		{"built-in into an image", shape, spec(img), "is the built-in guest, and the spec to restore it into has a root image"},
		{"image into another image", withImage, spec(other), "is not the image the VM was saved with"},
		{"image into a missing file", withImage, spec(filepath.Join(dir, "gone")), "root image: open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.h.compatible(tc.spec)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("compatible: %v, want %q", err, tc.want)
			}
		})
	}
	// Written and read back with the state.
	p := filepath.Join(dir, "state")
	f, err := createSaved(p, withImage)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	g, h, err := openSaved(p)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	if !h.RootImage || h.RootImageSHA256 != sum {
		t.Errorf("read back: %+v", h)
	}
}

// BenchmarkColdBootImage boots the default guest and an image guest (the
// busybox image, no main process) in turn, b.N of each, and reports each
// one's mean Start → Running (the backend's ReadyAfter), the image
// guest's as a percentage of the default's, and QEMU's RSS once ready.
// Interleaved, so that a loaded host slows both alike.
func BenchmarkColdBootImage(b *testing.B) {
	guestDir, _ := vmPrereqs(b)
	img := busyboxImage(b, guestDir, imagefs.Config{})
	be := newTestBackend(b, Options{})
	ctx := context.Background()
	var ready [2]time.Duration
	var rss [2]int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k, root := range []string{"", img} {
			id := fmt.Sprintf("bench_boot%d_%d", i, k)
			if _, err := be.Start(ctx, backend.Spec{ID: id, Name: "bench/boot", CPU: 1, MemoryMiB: 256, RootImage: root}); err != nil {
				b.Fatal(err)
			}
			inst := waitPhase(b, be, id, backend.Running, bootTimeout)
			b.StopTimer()
			ready[k] += inst.ReadyAfter
			rss[k] += vmRSSkB(inst.PID)
			b.Logf("boot %d, root image %v: ready after %s, RSS %d MiB", i, root != "", inst.ReadyAfter.Round(time.Millisecond), vmRSSkB(inst.PID)/1024)
			if err := be.Stop(ctx, id); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(ready[0].Milliseconds())/float64(b.N), "ms/boot-default")
	b.ReportMetric(float64(ready[1].Milliseconds())/float64(b.N), "ms/boot-image")
	b.ReportMetric(100*float64(ready[1])/float64(ready[0]), "image-%-of-default")
	b.ReportMetric(float64(rss[0])/1024/float64(b.N), "MiB-RSS-default")
	b.ReportMetric(float64(rss[1])/1024/float64(b.N), "MiB-RSS-image")
}

// A root image the guest cannot mount (not a squashfs) ends the VM, its
// console saying why, rather than leaving it never ready.
func TestImageGuestBadImage(t *testing.T) {
	vmPrereqs(t)
	bad := filepath.Join(shortTempDir(t), "bad.sqfs")
	if err := os.WriteFile(bad, bytes.Repeat([]byte("not a squashfs "), 1<<16), 0o644); err != nil {
		t.Fatal(err)
	}
	b := newTestBackend(t, Options{Log: testLogger(t)})
	ctx := context.Background()
	spec := backend.Spec{ID: "img_bad", Name: "img/bad", CPU: 1, MemoryMiB: 256, RootImage: bad}
	if _, err := b.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	var inst backend.Instance
	testenv.Eventually(t, bootTimeout, "the VM with a bad image to end", func() (bool, string) {
		var err error
		inst, err = b.Get(ctx, spec.ID)
		return err == nil && inst.Phase == backend.Exited, fmt.Sprintf("%+v %v", inst, err)
	})
	if !strings.Contains(inst.Reason, "powered off") ||
		!strings.Contains(inst.ConsoleTail, "mounting /dev/vda (squashfs)") ||
		!strings.Contains(inst.ConsoleTail, "kairon-init: image vda: its root could not be prepared (see above); powering off") {
		t.Errorf("the bad image's VM: reason %q, console:\n%s", inst.Reason, inst.ConsoleTail)
	}
	if _, err := b.Start(ctx, backend.Spec{ID: "img_none", RootImage: filepath.Join(t.TempDir(), "missing")}); err == nil || !strings.Contains(err.Error(), "qemu: root image: stat") {
		t.Errorf("a missing root image: %v", err)
	}
}
