package qemu

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/zyvor/kairon/internal/backend"
)

// Live migration. QEMU migrates into (and loads from) one end of a Unix
// socket pair; the Backend copies the other end to or from the connection
// the node agents set up, so QEMU never needs to reach the other node
// itself and the agents decide about TCP and TLS. The stream is the same as
// a saved state file: a saveHeader, then QEMU's migration stream.

var _ backend.LiveMigrator = (*Backend)(nil)

const (
	// liveBandwidth caps the migration stream: enough to converge for any
	// guest Kairon runs, without starving the node's other traffic.
	liveBandwidth = int64(1) << 30
	// liveDrainTimeout bounds waiting for the last bytes to leave after
	// QEMU reported the migration completed.
	liveDrainTimeout = 30 * time.Second
)

// SendLive implements backend.LiveMigrator. opts.MaxBandwidth becomes
// QEMU's max-bandwidth, opts.AutoConverge its auto-converge capability
// (set either way, since a QEMU keeps both from an earlier migration), and
// awaitMigrationWithin cancels the migration (migrate_cancel) on its
// timeouts.
func (b *Backend) SendLive(ctx context.Context, id string, w io.Writer, opts backend.LiveOptions) (time.Duration, error) {
	dir, done, err := b.beginLiveOp(id)
	if err != nil {
		return 0, err
	}
	defer done()
	hdr, err := b.headerOf(id, dir)
	if err != nil {
		return 0, err
	}
	buf, err := encodeHeader(hdr)
	if err != nil {
		return 0, err
	}
	if _, err := w.Write(buf); err != nil {
		return 0, fmt.Errorf("qemu: live migration of %s: sending the header: %w", id, err)
	}
	ours, theirs, err := socketPair()
	if err != nil {
		return 0, err
	}
	defer ours.Close()
	copied := make(chan error, 1)
	abort := make(chan error, 1)
	go func() {
		_, err := io.Copy(w, ours)
		if err != nil {
			abort <- err
		}
		copied <- err
	}()

	began := time.Now()
	sock := filepath.Join(dir, qmpSock)
	bandwidth := opts.MaxBandwidth
	if bandwidth <= 0 {
		bandwidth = liveBandwidth
	}
	// stoppedAt is when SendLive stopped the guest's vCPUs itself (under
	// TCG, see stopsBeforeCopy); zero if it did not.
	var stoppedAt time.Time
	err = qmpDo(ctx, sock, func(q *qmpConn) error {
		if err := setAutoConverge(q, opts.AutoConverge); err != nil {
			return err
		}
		if b.stopsBeforeCopy() {
			st, err := q.status()
			if err != nil {
				return err
			}
			if st.Running {
				if _, err := q.execute("stop", nil); err != nil {
					return err
				}
				stoppedAt = time.Now()
			}
		}
		return startMigration(q, theirs, bandwidth)
	})
	theirs.Close() // QEMU holds its own copy now
	if err != nil {
		b.resumeStopped(sock, stoppedAt)
		return 0, fmt.Errorf("qemu: live migration of %s: %w", id, err)
	}
	mig, err := awaitMigrationWithin(ctx, sock, abort, migrationLimits{completion: opts.CompletionTimeout, progress: opts.ProgressTimeout})
	if err != nil {
		// QEMU resumes a guest whose outgoing migration failed or was
		// cancelled if the guest ran when it began; one SendLive stopped,
		// SendLive resumes.
		b.resumeStopped(sock, stoppedAt)
		return 0, fmt.Errorf("qemu: live migration of %s: %w", id, err)
	}
	// The guest is stopped now (QEMU's post-migrate state); remember it, so
	// Get reports Paused even while QMP is busy.
	_ = os.WriteFile(filepath.Join(dir, pausedFile), nil, 0o644)
	// QEMU closes its end once done; the copy ends with the last byte sent.
	select {
	case err := <-copied:
		if err != nil {
			return 0, fmt.Errorf("qemu: live migration of %s: sending the stream: %w", id, err)
		}
	case <-time.After(liveDrainTimeout):
		return 0, fmt.Errorf("qemu: live migration of %s: the stream did not drain within %s", id, liveDrainTimeout)
	}
	downtime := time.Duration(mig.Downtime) * time.Millisecond
	if !stoppedAt.IsZero() {
		// QEMU counts from its own final stop; the guest has been stopped
		// since SendLive stopped it, and stays so until the target resumes
		// it, which can only be after the last byte left.
		downtime = time.Since(stoppedAt)
	}
	b.log.Info("sent live", "id", id, "took", time.Since(began), "downtime", downtime, "stoppedBeforeCopy", !stoppedAt.IsZero())
	return downtime, nil
}

// stopsBeforeCopy says whether SendLive stops the guest before QEMU copies
// its memory, rather than copying while it runs: under TCG. Under TCG, QEMU
// 7.2 (Debian 12's) loses guest stores made during the copy of a running
// guest: its fast dirty-bitmap sync clears the migration's dirty bits
// without resetting the vCPUs' TLB entries, so a store through an entry
// already marked dirty goes unrecorded and the target gets the page as it
// was last sent (fixed upstream in 2024 by "physmem: Fix migration dirty
// bitmap coherency with TCG memory access"; a version check could let a
// fixed QEMU copy a running guest again). The target's guest then crashed
// (list_add corruption, kernel page faults) within seconds, or hung. With
// the vCPUs stopped no page changes after it is sent: the guest is stopped
// for the whole copy, but arrives intact. KVM tracks dirty pages itself.
func (b *Backend) stopsBeforeCopy() bool { return b.accel == "tcg" }

// resumeStopped resumes a guest SendLive stopped (at stoppedAt; zero: it
// did not) after its migration failed or was cancelled, as QEMU does for
// a guest that ran when its migration began.
func (b *Backend) resumeStopped(sock string, stoppedAt time.Time) {
	if stoppedAt.IsZero() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cancelWait)
	defer cancel()
	if err := qmpDo(ctx, sock, func(q *qmpConn) error { _, err := q.execute("cont", nil); return err }); err != nil {
		b.log.Warn("resuming the guest after a failed live migration", "sock", sock, "err", err)
	}
}

// ReceiveLive implements backend.LiveMigrator.
func (b *Backend) ReceiveLive(ctx context.Context, spec backend.Spec, r io.Reader) (_ backend.Instance, err error) {
	hdr, err := readHeader(r, "live migration stream")
	if err != nil {
		return backend.Instance{}, err
	}
	ours, theirs, err := socketPair()
	if err != nil {
		return backend.Instance{}, err
	}
	defer theirs.Close() // the launched QEMU inherits its own copy
	defer func() {
		if err != nil {
			ours.Close() // no QEMU will read the stream: the copy ends at its next write
		}
	}()
	go func() {
		// Ends when the sender closes the connection, or with a write error
		// once QEMU, done loading, closed its end.
		_, _ = io.Copy(ours, r)
		ours.Close()
	}()
	return b.start(ctx, spec, &incoming{stream: theirs, header: hdr, origin: "live migration"})
}

// socketPair is a connected pair of Unix stream sockets.
func socketPair() (*os.File, *os.File, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("qemu: socket pair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "migration"), os.NewFile(uintptr(fds[1]), "migration-qemu"), nil
}
