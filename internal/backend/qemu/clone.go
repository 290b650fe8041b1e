package qemu

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/guestagent/client"
	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// Clones: a VM started from another VM's saved state (a MachinePool's
// template, spec.warmFrom Snapshot). QEMU loads the state as it would a
// Restore; then, before the clone may count as ready, its guest agent is
// told the clone's own identity (configure): hostname, MAC, address and
// gateway, a seed mixed into the kernel's entropy pool, and a new boot
// nonce. The guest's agent reports that nonce from then on, and the
// readiness watcher waits for exactly it (ready.go), so nothing the saved
// template reported counts for the clone.
//
// QEMU's vmgenid device would tell the guest kernel it was cloned (Linux
// then reseeds its RNG itself), but not on this machine type: microvm's
// ACPI tables (hw/i386/acpi-microvm.c) have no VMGENID device, only the
// pc and q35 machines build one, so the Debian kernel's vmgenid driver
// (CONFIG_VMGENID=y) never binds. The seed through the agent is the
// reseed.

// cloneConfigureTimeout bounds reaching the clone's agent and configuring it.
const cloneConfigureTimeout = 30 * time.Second

// cloneSeedBytes is the entropy a clone's kernel gets from the host.
const cloneSeedBytes = 64

var _ backend.Cloner = (*Backend)(nil)

// cloneConfigureSkipped, set only by tests, skips configuring the clones
// it names: a Backend stopped between a clone's restore and its configure.
var cloneConfigureSkipped atomic.Pointer[func(id string) bool]

// RestoreClone implements backend.Cloner.
func (b *Backend) RestoreClone(ctx context.Context, spec backend.Spec, path string) (backend.Instance, error) {
	if path == "" {
		return backend.Instance{}, errors.New("qemu: clone: no state file")
	}
	f, hdr, err := openSaved(path)
	if err != nil {
		return backend.Instance{}, err
	}
	defer f.Close()
	if !hdr.AgentPort {
		return backend.Instance{}, fmt.Errorf("qemu: clone %s: %s was saved without the guest agent's port, so the clone could not be given its own identity", spec.ID, path)
	}
	if !hdr.Ready {
		return backend.Instance{}, fmt.Errorf("qemu: clone %s: %s was saved before its guest was ready", spec.ID, path)
	}
	hdr.clone = true
	return b.start(ctx, spec, &incoming{stream: f, header: hdr, origin: path})
}

// cloneConfigure is the identity a clone of spec gets, with nonce.
func cloneConfigure(spec backend.Spec, nonce string) (*wire.Configure, error) {
	seed := make([]byte, cloneSeedBytes)
	if _, err := rand.Read(seed); err != nil {
		return nil, err
	}
	// A hostname is one DNS label here: no dots.
	cfg := &wire.Configure{Hostname: strings.ReplaceAll(hostnameFor(spec.Name), ".", "-"), Seed: seed, Boot: nonce}
	if n := spec.Network; n != nil {
		cfg.MAC = n.MAC
		if n.Address.IsValid() {
			cfg.Addresses = []string{n.Address.String()}
		}
		if n.Gateway.IsValid() {
			cfg.Gateway = n.Gateway.String()
		}
		if n.Nameserver.IsValid() {
			// Its own node's, as a booted guest gets with kairon.dns: the
			// template may have been saved on a node with another.
			cfg.DNS = []string{n.Nameserver.String()}
		}
	}
	return cfg, cfg.Validate()
}

// configureClone gives the restored guest of spec its identity through its
// agent, which it reaches again as soon as the guest runs. It returns when
// the guest reported itself ready with nonce on the same connection (the
// template was saved ready, so a clone usually is at once), or the zero
// time if it did not: a readiness watcher waits for it then.
func (b *Backend) configureClone(ctx context.Context, spec backend.Spec, nonce string) (time.Time, error) {
	if skip := cloneConfigureSkipped.Load(); skip != nil && (*skip)(spec.ID) {
		return time.Time{}, nil
	}
	cfg, err := cloneConfigure(spec, nonce)
	if err != nil {
		return time.Time{}, fmt.Errorf("qemu: clone %s: %w", spec.ID, err)
	}
	ctx, cancel := context.WithTimeout(ctx, cloneConfigureTimeout)
	defer cancel()
	began := time.Now()
	var last error
	for {
		dctx, cancel := context.WithTimeout(ctx, agentStatusTimeout)
		c, err := client.Dial(dctx, b.AgentSocket(spec.ID), client.Options{Name: "kairon-node/clone"})
		cancel()
		if err == nil {
			err = c.Configure(ctx, cfg)
			var readyAt time.Time
			if err == nil {
				// The ping a readiness watcher would dial for, without
				// another connection's handshake.
				sctx, cancel := context.WithTimeout(ctx, agentStatusTimeout)
				if st, serr := c.Status(sctx); serr == nil && st.Ready && st.Boot == nonce {
					readyAt = time.Now()
				}
				cancel()
			}
			_ = c.Close()
			if err == nil {
				b.log.Info("clone configured", "id", spec.ID, "hostname", cfg.Hostname, "mac", cfg.MAC, "addresses", cfg.Addresses, "took", time.Since(began), "ready", !readyAt.IsZero())
				return readyAt, nil
			}
			if ctx.Err() == nil && !errors.Is(err, client.ErrProtocol) && !errors.Is(err, client.ErrClosed) {
				// The agent answered and refused or failed a part.
				return time.Time{}, fmt.Errorf("qemu: clone %s: configure: %w", spec.ID, err)
			}
		}
		last = err
		if !sleepCtx(ctx, agentPollInterval) {
			return time.Time{}, fmt.Errorf("qemu: clone %s: the guest agent did not take its identity within %s: %v", spec.ID, cloneConfigureTimeout, last)
		}
	}
}
