package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/zyvor/kairon/internal/guestagent/agent"
)

// version is set at build time (-ldflags -X main.version=…).
var version = "dev"

// exitNoPort is the exit status when the VM has no agent port: the guest's
// init does not start the agent again then.
const exitNoPort = 3

func main() {
	if len(os.Args) > 1 {
		if sub, ok := subcommands[os.Args[1]]; ok {
			os.Exit(sub(os.Args[2:]))
		}
	}
	port := flag.String("port", "kairon.agent", "name of the virtio-serial port, or a device path")
	iface := flag.String("interface", "eth0", "network interface that configure requests set up")
	wait := flag.Duration("wait", 30*time.Second, "how long to wait for the port to appear")
	readyFile := flag.String("ready-file", "/run/kairon/ready", "file the guest's init creates once its services run; a ping reports the guest ready while it exists")
	root := flag.String("root", "", "an image guest's root (the image's tree under its overlay): commands run and files are read and written there; empty: the default guest")
	config := flag.String("config", "", "with --root, the image's config (internal/imagefs's config.json)")
	mainState := flag.String("main-state", "", "with --root, the state file of the image's main process (kairon-guest-agent main --state), which pings report")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	var img *agent.Image
	if *root != "" {
		var err error
		if img, err = agent.LoadImage(*root, *config); err != nil {
			log.Error("the guest's image", "root", *root, "err", err)
			os.Exit(1)
		}
	}

	dev, err := findPort(*port, *wait)
	if err != nil {
		log.Error("no agent port", "err", err)
		os.Exit(exitNoPort)
	}
	// Blocking I/O on a plain descriptor: the port reads 0 bytes while the
	// host is not connected, which the loop below waits out.
	fd, err := syscall.Open(dev, syscall.O_RDWR|syscall.O_CLOEXEC|syscall.O_NOCTTY, 0)
	if err != nil {
		log.Error("opening the agent port", "dev", dev, "err", err)
		os.Exit(1)
	}
	f := os.NewFile(uintptr(fd), dev)
	a := agent.New(agent.Options{
		Name:          "kairon-guest-agent/" + version,
		Log:           log,
		Configure:     agent.System{Interface: *iface, Root: *root}.Configure,
		Boot:          bootNonce(),
		ReadyFile:     *readyFile,
		Image:         img,
		MainStateFile: *mainState,
	})
	log.Info("serving", "port", dev)
	br := bufio.NewReaderSize(f, 64<<10)
	rw := struct {
		io.Reader
		io.Writer
	}{br, f}
	for {
		err := a.Serve(rw)
		if errors.Is(err, io.EOF) {
			// The host is not connected (or hung up): the port reads EOF
			// until it is again.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		// Out of step (or cut mid-frame): serve again from the next Hello.
		log.Warn("dropping the connection", "err", err)
		if err := agent.Resync(br); err != nil && !errors.Is(err, io.EOF) {
			log.Error("reading the agent port", "err", err)
			time.Sleep(time.Second)
		}
	}
}

// findPort returns the device of the virtio-serial port called name (or
// name itself if it is a path), waiting up to wait for it to appear.
func findPort(name string, wait time.Duration) (string, error) {
	if strings.HasPrefix(name, "/") {
		return name, nil
	}
	deadline := time.Now().Add(wait)
	for {
		ents, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, e := range ents {
			b, err := os.ReadFile(e)
			if err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(e))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port named %q after %s", name, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// bootNonce is the kernel command line's kairon.boot: the nonce kairon-node
// gave this boot, which every ping reports so that the host counts only a
// ready marker of the boot it started.
func bootNonce() string {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return ""
	}
	// The last one counts: kairon-node puts its own after any a Machine's
	// spec asked for.
	nonce := ""
	for _, w := range strings.Fields(string(b)) {
		if v, ok := strings.CutPrefix(w, "kairon.boot="); ok {
			nonce = v
		}
	}
	return nonce
}
