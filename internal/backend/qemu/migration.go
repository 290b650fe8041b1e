package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/zyvor/kairon/internal/backend"
)

// QEMU's migration stream is how a VM's state leaves and enters a process:
// Save and SendLive (live.go) migrate into a descriptor handed over QMP;
// Restore and ReceiveLive start QEMU with -incoming to load one.

// restoreTimeout bounds loading a saved VM.
const restoreTimeout = 2 * time.Minute

// incoming is a saved VM to load instead of booting: a state file for
// Restore, or one end of a socket pair fed from the network for ReceiveLive.
type incoming struct {
	stream *os.File // positioned at QEMU's migration stream
	header saveHeader
	origin string // recorded in spec.json
}

// finishRestore waits for the incoming migration to load and starts the vCPUs.
func (b *Backend) finishRestore(ctx context.Context, dir string, p *proc) error {
	ctx, cancel := context.WithTimeout(ctx, restoreTimeout)
	defer cancel()
	sock := filepath.Join(dir, qmpSock)
	for {
		var st qmpStatus
		var mig qmpMigration
		err := qmpDo(ctx, sock, func(q *qmpConn) error {
			var err error
			if st, err = q.status(); err != nil {
				return err
			}
			mig, err = q.migration()
			return err
		})
		select {
		case <-p.exited:
			return fmt.Errorf("qemu: restore: qemu exited (%s): %s", p.exitDesc(), lastLines(readTail(filepath.Join(dir, qemuLogFile), 4096), 5))
		default:
		}
		switch {
		case err != nil && (!errors.Is(err, os.ErrDeadlineExceeded) || ctx.Err() != nil):
			return fmt.Errorf("qemu: restore: %w", err)
		case err != nil:
			// QEMU answers its monitor from its main loop, which loading
			// the stream can keep busy past one conversation's deadline
			// on a loaded host (seen: query-migrate timing out during a
			// live migration's receive). Still loading: ask again, until
			// restoreTimeout.
		case mig.Status == "failed":
			return fmt.Errorf("qemu: restore: migration failed: %s", mig.ErrorDesc)
		case st.Status != "inmigrate":
			if !st.Running {
				if err := qmpDo(ctx, sock, func(q *qmpConn) error { _, err := q.execute("cont", nil); return err }); err != nil {
					return fmt.Errorf("qemu: restore: cont: %w", err)
				}
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("qemu: restore: still loading: %w", ctx.Err())
		case <-p.exited:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// startMigration hands QEMU the descriptor to migrate into and starts the
// migration, capped at maxBandwidth bytes per second.
func startMigration(q *qmpConn, f *os.File, maxBandwidth int64) error {
	if _, err := q.execute("migrate-set-parameters", map[string]any{"max-bandwidth": maxBandwidth}); err != nil {
		return err
	}
	_, _ = q.execute("closefd", map[string]any{"fdname": migrationFD})
	if _, err := q.executeWithFile("getfd", map[string]any{"fdname": migrationFD}, f); err != nil {
		return err
	}
	_, err := q.execute("migrate", map[string]any{"uri": "fd:" + migrationFD})
	return err
}

// migrationFD is the name the outgoing migration's descriptor has in QEMU.
const migrationFD = "kairon-migration"

// setAutoConverge sets QEMU's auto-converge migration capability: QEMU
// throttles the guest's vCPUs while it dirties memory faster than the
// migration sends it.
func setAutoConverge(q *qmpConn, on bool) error {
	_, err := q.execute("migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "auto-converge", "state": on}},
	})
	return err
}

// migrationLimits are when awaitMigration gives an outgoing migration up:
// completion after it started, progress after the RAM left to send last
// dropped below its lowest value. Zero is no limit.
type migrationLimits struct {
	completion, progress time.Duration
}

// migrationProgress follows the RAM an active migration has left to send:
// progress is a new low, as KubeVirt's progress watermark.
type migrationProgress struct {
	began, lastLow time.Time
	low            int64 // -1 before the first reading
}

func newMigrationProgress(now time.Time) *migrationProgress {
	return &migrationProgress{began: now, lastLow: now, low: -1}
}

// observe takes one query-migrate answer at now and returns the error that
// ends the migration under limits, or nil.
func (p *migrationProgress) observe(mig qmpMigration, now time.Time, limits migrationLimits) error {
	if mig.Status == "active" && mig.RAM != nil && (p.low < 0 || mig.RAM.Remaining < p.low) {
		p.low, p.lastLow = mig.RAM.Remaining, now
	}
	if limits.completion > 0 && now.Sub(p.began) > limits.completion {
		return fmt.Errorf("%w (%s; %d bytes of RAM left to send)", backend.ErrMigrationCompletionTimeout, limits.completion, max(p.low, 0))
	}
	if limits.progress > 0 && now.Sub(p.lastLow) > limits.progress {
		return fmt.Errorf("%w (%s without the RAM left to send dropping below %d bytes)", backend.ErrMigrationNoProgress, limits.progress, max(p.low, 0))
	}
	return nil
}

// cancelWait bounds waiting for QEMU to finish cancelling a migration.
const cancelWait = 10 * time.Second

// awaitMigration polls an outgoing migration until it completes, and
// cancels it when ctx ends or abort delivers an error first (the stream's
// reader went away).
func awaitMigration(ctx context.Context, sock string, abort <-chan error) (qmpMigration, error) {
	return awaitMigrationWithin(ctx, sock, abort, migrationLimits{})
}

// awaitMigrationWithin is awaitMigration that also cancels the migration
// when one of limits passes. After a cancel it waits (up to cancelWait)
// until QEMU no longer migrates, so a guest QEMU resumes runs on return.
func awaitMigrationWithin(ctx context.Context, sock string, abort <-chan error, limits migrationLimits) (qmpMigration, error) {
	cancel := func(cause error) (qmpMigration, error) {
		waitCtx, done := context.WithTimeout(context.Background(), cancelWait)
		defer done()
		_ = qmpDo(waitCtx, sock, func(q *qmpConn) error { _, err := q.execute("migrate_cancel", nil); return err })
		for waitCtx.Err() == nil {
			var mig qmpMigration
			err := qmpDo(waitCtx, sock, func(q *qmpConn) error { var err error; mig, err = q.migration(); return err })
			if err == nil && mig.Status != "active" && mig.Status != "cancelling" && mig.Status != "setup" {
				break
			}
			select {
			case <-waitCtx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
		return qmpMigration{}, cause
	}
	progress := newMigrationProgress(time.Now())
	for {
		var mig qmpMigration
		if err := qmpDo(ctx, sock, func(q *qmpConn) error { var err error; mig, err = q.migration(); return err }); err != nil {
			return mig, err
		}
		switch mig.Status {
		case "completed":
			return mig, nil
		case "failed", "cancelled":
			return mig, fmt.Errorf("migration %s: %s", mig.Status, mig.ErrorDesc)
		}
		if err := progress.observe(mig, time.Now(), limits); err != nil {
			return cancel(err)
		}
		select {
		case <-ctx.Done():
			return cancel(ctx.Err())
		case err := <-abort:
			return cancel(fmt.Errorf("sending the migration stream: %w", err))
		case <-time.After(10 * time.Millisecond):
		}
	}
}
