package v1alpha1

// Well-known labels and annotations. Controllers, kaironctl and the node agent
// share these names; never spell them out anywhere else.
const (
	// LabelMachinePool names the MachinePool a Machine was created for.
	LabelMachinePool = "kairon.zyvor.dev/machinepool"
	// LabelMachinePoolTemplateHash is the hash of the pool's spec.template the
	// Machine was built from; members with an older hash are replaced while warm.
	LabelMachinePoolTemplateHash = "kairon.zyvor.dev/machinepool-template-hash"
	// LabelPoolState is PoolStateWarm or PoolStateClaimed.
	LabelPoolState = "kairon.zyvor.dev/pool-state"
	// LabelMachineClaim names the MachineClaim that holds a claimed Machine.
	LabelMachineClaim = "kairon.zyvor.dev/machineclaim"
	// LabelMachineSet names the MachineSet that owns a Machine.
	LabelMachineSet = "kairon.zyvor.dev/machineset"

	// AnnotationCordonEvacuateAttemptedAt records when cordon-triggered
	// evacuation last tried to move a Machine (RFC 3339).
	AnnotationCordonEvacuateAttemptedAt = "kairon.zyvor.dev/cordon-evacuate-attempted-at"
	// LabelEvacuatedNode is on a MachineMigration that evacuation (kaironctl
	// evacuate or cordon evacuation) created: the node it moves the Machine off.
	LabelEvacuatedNode = "kairon.zyvor.dev/evacuated-node"
	// AnnotationQuotaAdmissionCharges is on a MachineQuota: the Machines the
	// admission webhook allowed that the quota's usage does not count yet
	// (JSON; see internal/rules/quota_admission.go). Only the webhook writes it.
	AnnotationQuotaAdmissionCharges = "kairon.zyvor.dev/admission-charges"
	// AnnotationClaimCreatedAt is on a MachineClaim: when its client created
	// it (RFC 3339 with milliseconds, e.g. 2026-12-02T12:00:00.123Z), which
	// kaironctl and the MCP server stamp. creationTimestamp has whole
	// seconds; the claim's bindMillis is measured from this instead. A stamp
	// that creationTimestamp rules out is ignored (rules.ClaimCreatedAt).
	AnnotationClaimCreatedAt = "kairon.zyvor.dev/created-at"
	// AnnotationRecordingBindOf is on a claimed Machine: the UID of the
	// claim whose bind kairon-controller's claim reconciler is recording
	// because the binder that took the Machine did not (it crashed, or its
	// writes failed). It is written, guarded by the Machine's
	// resourceVersion, before the claim's status names the Machine. While
	// that claim is Pending, nobody hands the Machine back to its pool: the
	// hand-back and the recording would otherwise both succeed, and the
	// Machine go to a second claim.
	AnnotationRecordingBindOf = "kairon.zyvor.dev/recording-bind-of"
)

// Values of LabelPoolState.
const (
	PoolStateWarm    = "warm"
	PoolStateClaimed = "claimed"
)

// Node labels set by kairon-node on the Node it serves.
const (
	// LabelNode marks a Node that runs Machines; the scheduler only uses these.
	LabelNode = "kairon.zyvor.dev/node"
	// LabelNodeBackend is the backend the node agent drives: qemu or sim.
	LabelNodeBackend = "kairon.zyvor.dev/backend"
	// LabelNodeAcceleration is kvm, tcg or sim.
	LabelNodeAcceleration = "kairon.zyvor.dev/acceleration"
	// LabelHollowNode is "true" on Nodes served by the sim backend: no VM
	// really runs there.
	LabelHollowNode = "kairon.zyvor.dev/hollow"
)

// FinalizerMachineVM keeps a Machine until its node agent stopped the VM and
// removed its tap and state.
const FinalizerMachineVM = "kairon.zyvor.dev/vm"

// FinalizerMachineClaim keeps a bound MachineClaim until kairon-controller
// deleted its egress policy and then deleted or handed back its Machine.
const FinalizerMachineClaim = "kairon.zyvor.dev/machineclaim"

// FinalizerMigrationSource keeps a MachineMigration whose source agent paused
// or is sending the guest, until that agent resumed the guest (the migration
// failed or was deleted before the switch) or stopped its copy (the guest
// runs on the target).
const FinalizerMigrationSource = "kairon.zyvor.dev/migration-source"

// AnnotationRestartedAt is what `kaironctl rollout restart machinepool`
// stamps on a pool's spec.template.metadata.annotations, as kubectl
// rollout restart stamps kubectl.kubernetes.io/restartedAt on a
// Deployment's: a new value is a new template, so the pool replaces its
// warm members and resolves its image's tag again.
const AnnotationRestartedAt = "kairon.zyvor.dev/restartedAt"
