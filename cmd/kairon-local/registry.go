package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/zyvor/kairon/internal/controlplane"
)

// defaultRegistryAddress is where kairon-local's registry listens unless
// --registry-address says otherwise: the address the examples and
// docs/guides/images.md name images by (127.0.0.1:5000/kairon/python:3.11).
const defaultRegistryAddress = "127.0.0.1:5000"

// registryBinary is Debian's docker-registry (distribution 2.8).
const registryBinary = "docker-registry"

// registryDir is where a data dir keeps the registry's config and storage,
// so that pushed images survive restarts.
func registryDir(dataDir string) string { return filepath.Join(dataDir, "registry") }

// registryOptions are kairon-local's registry flags, checked.
type registryOptions struct {
	enabled bool
	address string
	// explicit: --registry or --registry-address was given, so a taken
	// address or a missing docker-registry is an error rather than a
	// reason to run without a registry.
	explicit bool
	// imageCache is where the images users start from are built
	// (--image-cache).
	imageCache string
}

// checkRegistry decides, before anything starts, whether and where the
// registry runs. Unless asked for on the command line, a registry that
// cannot run (its default address taken by another kairon-local or the
// host's own docker-registry service, or docker-registry not installed)
// leaves kairon-local without one, with a warning: the rest of Kairon does
// not need it. Asked for, it must run.
func checkRegistry(o *registryOptions, warn func(string)) error {
	if !o.enabled {
		return nil
	}
	if err := loopbackAddress(o.address); err != nil {
		return fmt.Errorf("--registry-address %q: %v; the registry takes pushes without authentication, so it listens on this machine only (for example %s)", o.address, err, defaultRegistryAddress)
	}
	if _, err := exec.LookPath(registryBinary); err != nil {
		msg := fmt.Sprintf("the registry needs Debian's %s (apt-get install docker-registry; make deps installs it)", registryBinary)
		if o.explicit {
			return fmt.Errorf("%s, or run without it: --registry=false", msg)
		}
		warn(msg + ": running without a registry.")
		o.enabled = false
		return nil
	}
	ln, err := net.Listen("tcp", o.address)
	if err != nil {
		if o.explicit {
			return fmt.Errorf("--registry-address %s: %w; pick another address, or run without a registry: --registry=false", o.address, err)
		}
		warn(fmt.Sprintf("the registry's address %s is taken (%v): running without a registry. Choose another with --registry-address, or --registry=false to not ask for one.", o.address, err))
		o.enabled = false
		return nil
	}
	return ln.Close()
}

// registryConfig is docker-registry's configuration: storage in the data
// dir, deletes allowed (so `skopeo delete` and friends work), plain HTTP
// on a loopback address, no authentication.
func registryConfig(storage, address, secret string) string {
	return fmt.Sprintf(`# Written by kairon-local at every start; changes are lost.
version: 0.1
log:
  level: warn
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
  cache:
    blobdescriptor: inmemory
http:
  addr: %s
  secret: %s
  headers:
    X-Content-Type-Options: [nosniff]
`, strconv.Quote(storage), strconv.Quote(address), strconv.Quote(secret))
}

// registrySecret is the data dir's registry's http.secret, which signs the
// state of unfinished uploads: made once and kept, so that an upload may
// continue across a restart.
func registrySecret(dir string) (string, error) {
	file := filepath.Join(dir, "http-secret")
	if b, err := os.ReadFile(file); err == nil && len(b) >= 32 {
		return string(b), nil
	}
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return "", err
	}
	secret := hex.EncodeToString(buf)
	return secret, os.WriteFile(file, []byte(secret), 0o600)
}

// startRegistry runs docker-registry as a child of the control plane (its
// log in logs/registry.log; killed with kairon-local) and returns once it
// answers on /v2/.
func startRegistry(ctx context.Context, cp *controlplane.ControlPlane, address string) (*controlplane.Process, error) {
	bin, err := exec.LookPath(registryBinary)
	if err != nil {
		return nil, err
	}
	dir := registryDir(cp.DataDir())
	storage := filepath.Join(dir, "storage")
	if err := os.MkdirAll(storage, 0o700); err != nil {
		return nil, err
	}
	secret, err := registrySecret(dir)
	if err != nil {
		return nil, err
	}
	config := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(config, []byte(registryConfig(storage, address, secret)), 0o600); err != nil {
		return nil, err
	}
	proc, err := cp.StartProcess("registry", bin, []string{"serve", config})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	url := "http://" + address + "/v2/"
	var last error
	for {
		if proc.Exited() {
			return nil, proc.ExitError()
		}
		if last = answers(ctx, url); last == nil {
			return proc, nil
		}
		select {
		case <-ctx.Done():
			proc.Stop(5 * time.Second)
			return nil, fmt.Errorf("registry not ready on %s after 1m (%v); see %s", address, last, proc.LogPath())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// answers checks that a registry's API root says 200.
func answers(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(url + ": " + resp.Status)
	}
	return nil
}
