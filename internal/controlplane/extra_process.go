package controlplane

import (
	"path/filepath"
	"time"
)

// Process is a program run on top of the control plane — kairon-controller or
// a kairon-node agent — under the same rules as the control plane's own
// children: output appended to DataDir/logs/<name>.log, its own process
// group, and killed by the kernel if kairon-local dies.
type Process struct {
	child *child
	done  chan error
}

// StartProcess runs bin with args. The caller stops it before the control
// plane.
func (cp *ControlPlane) StartProcess(name, bin string, args []string) (*Process, error) {
	p := &Process{done: make(chan error, 1)}
	c, err := startChild(cp.spawner, filepath.Join(cp.dataDir, "logs"), name, bin, args, func(c *child) {
		p.done <- c.exitError()
	})
	if err != nil {
		return nil, err
	}
	p.child = c
	return p, nil
}

// Done delivers an error if the process exits without Stop.
func (p *Process) Done() <-chan error { return p.done }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool { return p.child.hasExited() }

// ExitError describes an unexpected exit, with the end of the log.
func (p *Process) ExitError() error { return p.child.exitError() }

// LogPath is where the process writes.
func (p *Process) LogPath() string { return p.child.logPath }

// Stop sends SIGTERM to the process group, and SIGKILL after grace.
func (p *Process) Stop(grace time.Duration) { p.child.stop(grace) }
