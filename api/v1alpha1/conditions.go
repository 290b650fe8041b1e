package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// This file is Kairon's status vocabulary: the condition types, the reasons
// of conditions and of MachineMigration status, and the reasons of the
// events Kairon records. Users, kaironctl, alerts and metric labels match on
// these words, so they are API: renaming one is a breaking change.

// ConditionType is the type of a condition in a Kairon object's
// status.conditions.
type ConditionType string

// String is the type as metav1.Condition stores it.
func (t ConditionType) String() string { return string(t) }

const (
	// ConditionReady is true when the object does what its spec asks.
	ConditionReady ConditionType = "Ready"
	// ConditionScheduled is the Machine condition the scheduler owns: true
	// once the Machine has a node.
	ConditionScheduled ConditionType = "Scheduled"
	// ConditionReplicaFailure is true on a MachineSet or MachinePool while
	// it cannot create or delete Machines, as on a ReplicaSet.
	ConditionReplicaFailure ConditionType = "ReplicaFailure"
)

// ConditionEgressEnforced is true on a bound MachineClaim with spec.egress
// once the node running its Machine reports the claim's egress policy, at
// the policy's current generation, in force for the Machine.
const ConditionEgressEnforced ConditionType = "EgressEnforced"

// Reasons of a MachineClaim's EgressEnforced condition.
const (
	EgressReasonEnforced          = "Enforced"
	EgressReasonNotYetEnforced    = "NotYetEnforced"
	EgressReasonEnforcementFailed = "EnforcementFailed"
)

// Reasons of a Machine's Ready condition, written by the node agent that
// runs it.
const (
	MachineReasonBooting     = "Booting"
	MachineReasonGuestReady  = "GuestReady"
	MachineReasonStartFailed = "StartFailed"
	MachineReasonStopFailed  = "StopFailed"
	MachineReasonStopped     = "Stopped"
	MachineReasonVMExited    = "VMExited"
	MachineReasonDeleting    = "Deleting"
	// MachineReasonResumeFailed: a VM saved when its agent stopped
	// (kairon-node --on-shutdown=suspend) could not be restored; it is not
	// rebooted in its place, since that would lose the guest's memory.
	MachineReasonResumeFailed = "ResumeFailed"
	// MachineReasonSuspendIncomplete: the agent stopped while saving the VM
	// and QEMU is gone, so neither the VM nor a complete state is left.
	MachineReasonSuspendIncomplete = "SuspendIncomplete"
)

// ConditionGuestAgentReady is the Machine condition the node agent keeps
// while the Machine is Running on a backend with a guest agent channel:
// true while the guest's agent answers the node's pings (each tick). A
// MachinePool with spec.readiness GuestAgent binds only members with it.
const ConditionGuestAgentReady ConditionType = "GuestAgentReady"

// Reasons of a Machine's GuestAgentReady condition.
const (
	GuestAgentReasonAnswered     = "AgentAnswered"
	GuestAgentReasonNotAnswering = "AgentNotAnswering"
	GuestAgentReasonNotRunning   = "MachineNotRunning"
)

// ConditionNodeReachable is on a Machine whose node's agent stopped
// renewing its Lease (kube-node-lease/kairon-<node>) for longer than
// kairon-controller's -node-grace-period: False with reason
// NodeReachableReasonLeaseExpired, and True again (reason
// NodeReachableReasonLeaseRenewed) once the agent renews it. A Machine that
// never ran on an unreachable node has no such condition. The same
// condition is on a bound MachineClaim whose Machine it is on. Written by
// kairon-controller (nodehealth_controller.go); nothing is deleted or
// recreated because of it: the node may still run the VM.
const ConditionNodeReachable ConditionType = "NodeReachable"

// Reasons of the NodeReachable condition (Machines, MachineClaims) and of
// NodeConditionAgentReady (Nodes).
const (
	NodeReachableReasonLeaseExpired = "NodeLeaseExpired"
	NodeReachableReasonLeaseRenewed = "NodeLeaseRenewed"
)

// NodeConditionAgentReady is the Node condition kairon-controller keeps on
// every Kairon node whose agent holds a Lease: True while the agent renews
// it, Unknown once it has not for the grace period. Kairon owns it on every
// installation; the Node's Ready condition is Kairon's only on a node its
// agent registered (kairon-local), where it goes Unknown too. Under Helm
// Ready is the kubelet's, and this condition alone says the agent is gone.
const NodeConditionAgentReady ConditionType = "KaironAgentReady"

// Reasons of a Machine's Ready condition for a VM that did not start.
const (
	// MachineReasonBootTimeout: the VM did not reach Running within the
	// node agent's --boot-timeout of its first start attempt; it is
	// stopped and the Machine Failed.
	MachineReasonBootTimeout = "BootTimeout"
	// MachineReasonStartRetrying: starting the VM failed in a way that can
	// pass (an address, a tap, the disk); the agent tries again with
	// backoff until --boot-timeout.
	MachineReasonStartRetrying = "StartRetrying"
	// MachineReasonAddressInUse: the guest address the node would give
	// the VM is held by another Machine of the cluster; the VM does not
	// start (the Machine stays Pending) until the address is free or the
	// node picks another.
	MachineReasonAddressInUse = "AddressInUse"
)

// Reasons of a Machine's Scheduled condition.
const (
	MachineReasonScheduled     = "Scheduled"
	MachineReasonUnschedulable = "Unschedulable"
	MachineReasonQuotaExceeded = "QuotaExceeded"
)

// Reasons of the MachineSet Ready condition.
const (
	SetReasonAllReplicasReady = "AllReplicasReady"
	SetReasonReplicasNotReady = "ReplicasNotReady"
	SetReasonInvalidSelector  = "InvalidSelector"
)

// Reasons of the ReplicaFailure condition of a MachineSet or MachinePool,
// also the reasons of the Warning events a failed create or delete records.
const (
	ReplicaReasonFailedCreate = "FailedCreate"
	ReplicaReasonFailedDelete = "FailedDelete"
)

// Reasons of the MachinePool Ready condition.
const (
	PoolReasonWarmMachinesReady    = "WarmMachinesReady"
	PoolReasonWarmMachinesNotReady = "WarmMachinesNotReady"
)

// ConditionSnapshotReady is on a MachinePool with spec.warmFrom Snapshot:
// true once the template Machine of the current spec.template is saved
// (status.snapshot) and new members are restored from it.
const ConditionSnapshotReady ConditionType = "SnapshotReady"

// Reasons of a MachinePool's SnapshotReady condition.
const (
	// SnapshotReasonTemplateBooting: the template Machine is being created,
	// scheduled or booted; members boot meanwhile.
	SnapshotReasonTemplateBooting = "TemplateBooting"
	// SnapshotReasonSaving: the template runs and its node was asked to
	// save it.
	SnapshotReasonSaving = "Saving"
	// SnapshotReasonSaved: status.snapshot is the current template's.
	SnapshotReasonSaved = "Saved"
	// SnapshotReasonFailed: the template Machine failed (it is replaced) or
	// its node could not save it; members boot meanwhile.
	SnapshotReasonFailed = "SnapshotFailed"
)

// Reasons of a Machine's Ready condition for a pool's template Machine and
// its clones.
const (
	// MachineReasonSnapshotSaved: the template Machine's VM was saved for
	// its pool's clones and stopped; it is not booted again.
	MachineReasonSnapshotSaved = "SnapshotSaved"
	// MachineReasonSnapshotFailed: the node could not save the template.
	MachineReasonSnapshotFailed = "SnapshotFailed"
	// MachineReasonRestoredClone: the guest was restored from its pool's
	// snapshot and given its own identity.
	MachineReasonRestoredClone = "RestoredClone"
)

// Reasons of a MachineSnapshot's Ready condition, also the reasons of the
// events the node agent records on the snapshot and its Machine.
const (
	// SnapshotReasonWaitingForMachine: the Machine does not exist, is not
	// placed, or is not Running yet; the snapshot is taken once it is.
	SnapshotReasonWaitingForMachine = "WaitingForMachine"
	// SnapshotReasonTaken: the state file is complete in status.store.
	SnapshotReasonTaken = "SnapshotTaken"
	// SnapshotReasonSaveFailed: the node could not save the guest (it
	// resumed it); the snapshot is Failed for good.
	SnapshotReasonSaveFailed = "SnapshotSaveFailed"
)

// Reasons of a restored Machine (spec.restoreFrom): its Scheduled condition
// while it waits for a node, its Ready condition and events once placed.
const (
	// MachineReasonSnapshotNotReady: the MachineSnapshot is missing or not
	// Ready; the Machine stays Pending until it is.
	MachineReasonSnapshotNotReady = "SnapshotNotReady"
	// MachineReasonRestored: the guest was started from the snapshot's
	// saved state and given this Machine's identity.
	MachineReasonRestored = "RestoredFromSnapshot"
	// MachineReasonRestoreFailed: the node could not start the guest from
	// the snapshot (file unreachable, shape differs, the restore failed).
	MachineReasonRestoreFailed = "RestoreFailed"
)

// Reasons of a SnapshotSchedule's Ready condition and events.
const (
	ScheduleReasonScheduled       = "Scheduled"
	ScheduleReasonSuspended       = "Suspended"
	ScheduleReasonInvalidSchedule = "InvalidSchedule"
	// ScheduleReasonSnapshotsCreated and ScheduleReasonSnapshotsPruned are
	// the reasons of the schedule's events.
	ScheduleReasonSnapshotsCreated = "SnapshotsCreated"
	ScheduleReasonSnapshotsPruned  = "SnapshotsPruned"
)

// Reasons of the MachineClaim Ready condition.
const (
	ClaimReasonBound                 = "Bound"
	ClaimReasonWaitingForWarmMachine = "WaitingForWarmMachine"
	ClaimReasonPoolNotFound          = "PoolNotFound"
	ClaimReasonPoolDeleting          = "PoolDeleting"
	ClaimReasonInvalidLabels         = "InvalidLabels"
	ClaimReasonEgressPolicyFailed    = "EgressPolicyFailed"
	ClaimReasonEgressNotEnforced     = "EgressNotEnforced"
	ClaimReasonMachineLost           = "MachineLost"
)

// Reasons of a MachineQuota's Ready condition.
const (
	QuotaReasonWithinLimits  = "WithinLimits"
	QuotaReasonLimitExceeded = "LimitExceeded"
)

// Reasons of a MachineDisruptionBudget's Ready condition.
const (
	BudgetReasonStatusComputed = "StatusComputed"
	BudgetReasonInvalid        = "InvalidBudget"
)

// MigrationReason is a MachineMigration's status.reason: one CamelCase word
// for how it is going or how it ended. It is also the reason label of
// kairon_machinemigrations_total.
type MigrationReason string

// Reasons the controller writes.
const (
	MigrationReasonStarted               MigrationReason = "Started"
	MigrationReasonSucceeded             MigrationReason = "Succeeded"
	MigrationReasonMachineNotFound       MigrationReason = "MachineNotFound"
	MigrationReasonMachineNotRunning     MigrationReason = "MachineNotRunning"
	MigrationReasonTargetUnavailable     MigrationReason = "TargetUnavailable"
	MigrationReasonMachineMovedElsewhere MigrationReason = "MachineMovedElsewhere"
	MigrationReasonTimeout               MigrationReason = "Timeout"
	// MigrationReasonAlreadyMigrating: another migration of the same
	// Machine was in flight first; only one may move a Machine at a time.
	MigrationReasonAlreadyMigrating MigrationReason = "AlreadyMigrating"
	// MigrationReasonParallelLimitReached is on a migration left Pending
	// because its MigrationPolicy's maxParallelMigrations (cluster) or
	// maxParallelOutboundPerNode (its Machine's node) are taken by
	// Running migrations; it starts once one of them ends. The message
	// names the policy and the limit.
	MigrationReasonParallelLimitReached MigrationReason = "ParallelLimitReached"
	// MigrationReasonNodeFenced: the migration's source or target node was
	// fenced (kaironctl fence) before the guest ran on the target; the
	// message names the node and which end it was.
	MigrationReasonNodeFenced MigrationReason = "NodeFenced"
)

// Reasons the source node's agent writes when it cancels a live migration
// under its MigrationPolicy (status.migrationPolicy). The guest keeps
// running on the source.
const (
	// MigrationReasonNoProgress: the guest memory left to send did not drop
	// below its lowest value for progressTimeoutSeconds.
	MigrationReasonNoProgress MigrationReason = "NoProgress"
	// MigrationReasonCompletionTimeout: the live migration ran longer than
	// completionTimeoutSeconds.
	MigrationReasonCompletionTimeout MigrationReason = "CompletionTimeout"
)

// Reasons the node agents write when their part of a migration fails.
const (
	MigrationReasonSaveFailed          MigrationReason = "SaveFailed"
	MigrationReasonTransferFailed      MigrationReason = "TransferFailed"
	MigrationReasonTransferInterrupted MigrationReason = "TransferInterrupted"
	MigrationReasonRestoreFailed       MigrationReason = "RestoreFailed"
	MigrationReasonReceiveFailed       MigrationReason = "ReceiveFailed"
	MigrationReasonTargetUnreachable   MigrationReason = "TargetUnreachable"
	// MigrationReasonTargetRefused: the target node's agent would not take
	// the guest from this source (its certificate, or the request).
	MigrationReasonTargetRefused    MigrationReason = "TargetRefused"
	MigrationReasonLiveNotSupported MigrationReason = "LiveNotSupported"
)

// ConditionStrategyChosen is on a MachineMigration that cordon evacuation
// created with strategy auto (controller.cordonEvacuation.strategy, or
// kairon-controller -cordon-evacuate-strategy auto): always True, its
// reason says which strategy spec.strategy got and why, its message names
// the nodes. Written by kairon-controller from the migration's
// AnnotationMigrationRequestedStrategy, AnnotationMigrationStrategyReason
// and AnnotationMigrationStrategyMessage, which cordon evacuation sets
// when it creates the migration.
const ConditionStrategyChosen ConditionType = "StrategyChosen"

// Reasons of the StrategyChosen condition. StrategyReasonLive is the only
// one with spec.strategy live; every other means cold.
const (
	// StrategyReasonLive: the Machine runs, its node can send it live and
	// the target (pinned in spec.targetNode) can receive it live: the same
	// backend and acceleration, and a migration endpoint.
	StrategyReasonLive = "LiveMigratable"
	// StrategyReasonMachineNotLive: the Machine is not Running, so there is
	// no running guest to move live.
	StrategyReasonMachineNotLive = "MachineNotLiveMigratable"
	// StrategyReasonSourceCannotSendLive: the Machine's node has a backend
	// that cannot send a live migration (or is gone).
	StrategyReasonSourceCannotSendLive = "SourceCannotSendLive"
	// StrategyReasonTargetCannotReceiveLive: no node that can take the
	// Machine can receive it live from its node (no migration endpoint,
	// another backend or acceleration); the scheduler picks a cold target.
	StrategyReasonTargetCannotReceiveLive = "TargetCannotReceiveLive"
)

// Reasons of the events Kairon records (kubectl get events
// --field-selector reason=...). Events of a failed migration carry its
// MigrationReason instead.
const (
	EventReasonSuccessfulCreate = "SuccessfulCreate"
	EventReasonSuccessfulDelete = "SuccessfulDelete"
	// EventReasonFailedScheduling is the scheduler's Warning on a Machine
	// it cannot place.
	EventReasonFailedScheduling = "FailedScheduling"
	// EventReasonReturnedToPool is on a released member that rejoined its
	// pool warm.
	EventReasonReturnedToPool = "ReturnedToPool"
	EventReasonReleased       = "Released"
	EventReasonExpired        = "Expired"
	// EventReasonMigrated is on a Machine that moved to another node.
	EventReasonMigrated = "Migrated"
	// The node agent's events on a Machine whose VM it starts and stops.
	// A failed start or an exited VM is a Warning with the Ready
	// condition's reason (MachineReasonStartFailed, MachineReasonVMExited).
	EventReasonStarted = "Started"
	EventReasonStopped = "Stopped"
	// A suspending agent (kairon-node --on-shutdown=suspend) saved the VM
	// and stopped QEMU, or could not and left it running; Resumed reports
	// how long the guest was paused. A restore that fails marks the
	// Machine Failed with MachineReasonResumeFailed.
	EventReasonSuspended     = "Suspended"
	EventReasonSuspendFailed = "SuspendFailed"
	EventReasonResumed       = "Resumed"
	// Cordon evacuation's events on the Machines of a cordoned node.
	EventReasonEvacuationMigrationCreated = "EvacuationMigrationCreated"
	EventReasonEvacuationBlocked          = "EvacuationBlocked"
	EventReasonEvacuationFailed           = "EvacuationFailed"
	// kairon-controller's events on a Node whose agent's Lease expired
	// (Warning) or is renewed again (Normal), and on each Machine there.
	EventReasonNodeUnreachable = "NodeUnreachable"
	EventReasonNodeReachable   = "NodeReachable"
	// EventReasonDeletedFailed is on a MachineSet or MachinePool that
	// deleted a Failed Machine (its VM is gone) after counting it out and
	// creating its replacement; the message carries the Machine's reason.
	EventReasonDeletedFailed = "DeletedFailedMachine"
	// EventReasonStartRetrying is the node agent's Warning on a Machine
	// whose VM start failed in a way that can pass; it tries again.
	EventReasonStartRetrying = MachineReasonStartRetrying
	// EventReasonAddressInUse is the node agent's Warning on a Machine
	// whose VM it would not start: another Machine holds its address.
	EventReasonAddressInUse = MachineReasonAddressInUse
	// EventReasonEgressDenied is the node agent's Warning on a confined
	// Machine whose egress was refused (a DNS name), at most one a minute.
	EventReasonEgressDenied = "EgressDenied"
)

// CauseTypeDisruptionBudget is the cause a refused MachineMigration carries
// when a MachineDisruptionBudget does not allow the move now (HTTP 429, as
// the Eviction API answers for a PodDisruptionBudget). Clients match the
// cause, never the message.
const CauseTypeDisruptionBudget metav1.CauseType = "DisruptionBudget"

// Fence and recover (kaironctl fence / recover; TaintNodeFenced): the
// reason of a MachineClaim Lost because its Machine's node was fenced, and
// the events on the Node, its Machines and their claims.
const (
	// ClaimReasonNodeFenced: the claim's Machine ran on a node an operator
	// fenced, and it has no Ready MachineSnapshot to come back from.
	ClaimReasonNodeFenced = "NodeFenced"
	// EventReasonNodeFenced is kairon-controller's Warning on a Node it
	// sees fenced; EventReasonNodeRecovered its Normal once the fence is
	// lifted.
	EventReasonNodeFenced    = "NodeFenced"
	EventReasonNodeRecovered = "NodeRecovered"
	// Events on each Machine of a fenced node: deleted so that its
	// MachineSet or MachinePool replaces it elsewhere (or its claim went
	// Lost), recreated from its newest Ready MachineSnapshot, or left where
	// it is (no owner, no snapshot).
	EventReasonFenceReplaced = "FencedMachineReplaced"
	EventReasonFenceRestored = "FencedMachineRestored"
	EventReasonFenceLeft     = "FencedMachineLeft"
	// EventReasonStaleVMDestroyed is a node agent's Warning on its Node: at
	// start, before it reported Ready, it destroyed a VM whose Machine runs
	// elsewhere now, was recreated, or no longer exists (fencing on rejoin).
	EventReasonStaleVMDestroyed = "StaleVMDestroyed"
)

// ConditionCapacityBooked is on a placed Machine while kairon-controller
// books its CPU and memory with the kubelet through a booking pod
// (-capacity-booking-pods): True once the kubelet runs the pod, False when
// the kubelet rejected it (a node short of room, for example OutOfmemory),
// with the kubelet's reason in the message. kairon-controller also records
// a Warning event of reason CapacityBookingRejected on the Machine, and
// replaces the rejected pod after a minute.
const ConditionCapacityBooked ConditionType = "CapacityBooked"

// Reasons of a Machine's CapacityBooked condition; CapacityBookingRejected
// is also its event's reason.
const (
	CapacityBookingReasonBooked   = "Booked"
	CapacityBookingReasonRejected = "CapacityBookingRejected"
)

// Reasons of a Machine's Ready condition while its OCI image (spec.image)
// is fetched, and when it cannot be.
const (
	// MachineReasonPullingImage: the node is pulling and converting
	// spec.image; the Machine stays Pending meanwhile.
	MachineReasonPullingImage = "PullingImage"
	// MachineReasonImagePullFailed: the image cannot be pulled or used;
	// the message names the reference and the cause (not found,
	// unauthorized, too large, wrong platform, …). The Machine is Failed.
	MachineReasonImagePullFailed = "ImagePullFailed"
)

// Reasons of the events a node records while fetching a Machine's image,
// the words kubelet uses for a Pod's.
const (
	EventReasonImagePulling = "Pulling"
	EventReasonImagePulled  = "Pulled"
	EventReasonImageFailed  = "Failed"
)

// ConditionMainProcess is the Machine condition for an OCI image with an
// entrypoint (its config's Entrypoint and Cmd): true while that process
// runs in the guest, false once it exited, with the exit in the message.
const ConditionMainProcess ConditionType = "MainProcess"

// Reasons of a Machine's MainProcess condition, and of the events recorded
// when the main process ends.
const (
	MainProcessReasonRunning        = "Running"
	MainProcessReasonCompleted      = "Completed" // exit status 0
	MainProcessReasonFailed         = "Failed"    // another status, or a signal
	EventReasonMainProcessCompleted = "MainProcessCompleted"
	EventReasonMainProcessFailed    = "MainProcessFailed"
)

// The MachinePool condition saying whether its template's image is pinned,
// and its reasons. The condition is absent for a built-in image.
const (
	ConditionImageResolved ConditionType = "ImageResolved"
	// ImageReasonResolved: the registry named the digest members are pinned to.
	ImageReasonResolved = "Resolved"
	// ImageReasonPinnedByDigest: spec.template.spec.image carries its
	// digest; no registry is asked.
	ImageReasonPinnedByDigest = "PinnedByDigest"
	// ImageReasonResolving: the registry is being asked; no member is
	// created meanwhile.
	ImageReasonResolving = "Resolving"
	// ImageReasonResolveFailed: the registry could not be asked, or said
	// no; the message names the reference and the cause. No member is
	// created until it is retried with success.
	ImageReasonResolveFailed = "ResolveFailed"
)

// Reasons of the events on a pool about its image.
const (
	EventReasonResolvedImage      = "ResolvedImage"
	EventReasonFailedResolveImage = "FailedResolveImage"
)
