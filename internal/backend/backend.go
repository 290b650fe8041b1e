package backend

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"time"
)

// ErrNotFound is returned for an instance ID the backend does not know.
var ErrNotFound = errors.New("instance not found")

// Spec is everything a backend needs to start one VM.
type Spec struct {
	// ID is unique on the node and safe as a file name: "<namespace>_<name>".
	ID string
	// Name is "<namespace>/<name>", shown in process lists (QEMU -name).
	Name string
	// CPU is the number of vCPUs; MemoryMiB the guest memory.
	CPU       int32
	MemoryMiB int64
	// Kernel and Initrd are paths of the guest image to boot directly.
	Kernel string
	Initrd string
	// KernelArgs are appended to the backend's own kernel command line.
	KernelArgs []string
	// RootImage is the path on the node of an OCI image converted into one
	// read-only filesystem (internal/imagefs), which the guest boots
	// instead of the built-in guest's own services; empty: the built-in
	// guest. A VM saved or migrating with one is restored or received only
	// with one (the same image: the node makes sure it has its digest).
	RootImage string
	// Network attaches the VM to the node's bridge; nil runs it without a NIC.
	Network *Network
}

// Network is the VM's attachment to the node network. The node agent creates
// and deletes the tap (it owns it, so it can also filter its traffic); the
// backend only opens it.
type Network struct {
	TapName string
	MAC     string
	Address netip.Prefix // the guest's address and prefix, e.g. 10.88.0.5/24
	Gateway netip.Addr
	// Nameserver is the resolver the guest is configured with (its
	// /etc/resolv.conf); the zero Addr configures none.
	Nameserver netip.Addr
}

// Phase is what a backend observes of one VM.
type Phase string

const (
	// Booting: the VM process runs, the guest has not reported ready yet.
	Booting Phase = "Booting"
	// Running: the guest printed its ready marker and the process runs.
	Running Phase = "Running"
	// Paused: the VM process runs with its vCPUs stopped.
	Paused Phase = "Paused"
	// Exited: the VM process is gone without being stopped through the backend.
	Exited Phase = "Exited"
)

// Instance is one VM as the backend sees it.
type Instance struct {
	ID    string
	Name  string
	PID   int // 0 for backends without a process
	Phase Phase
	// Reason and ConsoleTail explain an Exited instance.
	Reason      string
	ConsoleTail string
	StartedAt   time.Time
	// ReadyAfter is the time from start to the guest's ready marker; zero until Running.
	ReadyAfter time.Duration
	// Acceleration is kvm, tcg or sim.
	Acceleration string
}

// Backend runs VMs on one node. Every method is safe for concurrent use.
// Instances survive the agent: a new Backend over the same state directory
// re-adopts what is still running, and List reports it unchanged.
type Backend interface {
	// Name is the backend's name: "qemu" or "sim".
	Name() string
	// Acceleration is what new VMs run with: kvm, tcg or sim.
	Acceleration() string
	// Start launches a VM and returns once its process runs (phase Booting).
	// Starting an ID that already runs returns the running instance.
	Start(ctx context.Context, spec Spec) (Instance, error)
	// Stop ends a VM and removes everything the backend kept for it. Stopping
	// an unknown ID is not an error.
	Stop(ctx context.Context, id string) error
	// Pause and Resume stop and restart the vCPUs of a running VM.
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Save writes the VM's full state (memory and devices) to path, leaving it paused.
	Save(ctx context.Context, id, path string) error
	// Restore starts spec from state written by Save, instead of booting.
	Restore(ctx context.Context, spec Spec, path string) (Instance, error)
	// Get reports one instance, refreshed; ErrNotFound if unknown.
	Get(ctx context.Context, id string) (Instance, error)
	// List reports every instance the backend knows, including Exited ones
	// that were not stopped through it.
	List(ctx context.Context) ([]Instance, error)
	// ConsoleLog is the path of the file holding the VM's serial console.
	ConsoleLog(id string) string
}

// Cloner is implemented by backends that start a VM as a clone of another
// one's saved state (a MachinePool with spec.warmFrom Snapshot).
type Cloner interface {
	// RestoreClone starts spec from path, a state Save wrote of another
	// VM with the same shape, and gives the guest spec's identity before
	// it counts as ready: hostname (from spec.Name), spec.Network's
	// address, gateway and MAC, a fresh seed for its RNG and a new boot
	// nonce, which the instance is Running only once the guest reports.
	RestoreClone(ctx context.Context, spec Spec, path string) (Instance, error)
}

// LiveOptions shape one outgoing live migration: the values of the
// MigrationPolicy it runs under (a MachineMigration's
// status.migrationPolicy). The zero value is the backend's defaults.
type LiveOptions struct {
	// MaxBandwidth caps the stream, in bytes per second; 0 is the
	// backend's default.
	MaxBandwidth int64
	// AutoConverge lets the hypervisor slow the guest's vCPUs down when it
	// dirties memory faster than the stream carries it.
	AutoConverge bool
	// CompletionTimeout cancels the migration when it has not completed
	// this long after it started; 0 is none.
	CompletionTimeout time.Duration
	// ProgressTimeout cancels the migration when the guest memory left to
	// send has not dropped below its lowest value for this long; 0 is none.
	ProgressTimeout time.Duration
}

// Errors a live migration cancelled under its LiveOptions wraps; the guest
// runs on at the source.
var (
	ErrMigrationNoProgress        = errors.New("the migration made no progress within its progress timeout")
	ErrMigrationCompletionTimeout = errors.New("the migration did not complete within its completion timeout")
)

// LiveMigrator is implemented by backends that can move a VM to another node
// while it runs. The node agents connect the two ends (agent to agent over
// TCP, TLS when configured) and hand each side its end of the connection;
// what flows over it is the backend's own business.
type LiveMigrator interface {
	// SendLive streams the running VM id to w while the guest keeps running,
	// and returns once the whole state is sent. The guest is then paused
	// here: the agent stops this copy once the receiver took over, or
	// resumes it if the migration failed after all. On an error the guest
	// runs on here. downtime is how long the guest did not run, as far as
	// the sender can tell. opts are the migration's MigrationPolicy values;
	// a cancelled migration's error wraps ErrMigrationNoProgress or
	// ErrMigrationCompletionTimeout.
	SendLive(ctx context.Context, id string, w io.Writer, opts LiveOptions) (downtime time.Duration, err error)
	// ReceiveLive starts spec from the stream SendLive writes, read from r,
	// and returns once the guest runs here.
	ReceiveLive(ctx context.Context, spec Spec, r io.Reader) (Instance, error)
}
