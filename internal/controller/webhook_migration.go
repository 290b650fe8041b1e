package controller

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// MachineMigrationWebhookPath is where the validating webhook for
// MachineMigrations is served.
const MachineMigrationWebhookPath = "/validate-machinemigration"

// MachineMigrationValidator refuses to create a MachineMigration that the
// MachineDisruptionBudgets of its Machine do not allow right now, so a
// migration created straight through the API is held to the same budgets
// as kaironctl evacuate and cordon evacuation. The decision is
// rules.AdmitDisruption's, on budget states loaded at the moment of the request.
// It also refuses a second migration of a Machine while one is in flight
// (rules.ConflictingMigration): two would move the same VM at once.
//
// Only CREATE is judged: a migration's spec cannot change after creation,
// and deleting or relabeling one never disrupts anything.
type MachineMigrationValidator struct {
	// Reader should read from the API server, not a cache: a cache that
	// lags would not show the migrations created a moment ago, and would
	// let a quick series of creates through past a budget.
	Reader client.Reader
}

var _ admission.Validator[*kaironv1.MachineMigration] = &MachineMigrationValidator{}

// NewMachineMigrationWebhook returns the admission webhook to serve at
// MachineMigrationWebhookPath.
func NewMachineMigrationWebhook(scheme *runtime.Scheme, reader client.Reader) *admission.Webhook {
	return admission.WithValidator[*kaironv1.MachineMigration](scheme, &MachineMigrationValidator{Reader: reader})
}

// ValidateCreate refuses a migration of a Machine that does not exist, one
// that a budget matching the Machine does not allow now, and one of a
// Machine that another migration is moving (403 Forbidden).
func (v *MachineMigrationValidator) ValidateCreate(ctx context.Context, mig *kaironv1.MachineMigration) (admission.Warnings, error) {
	machinePath := field.NewPath("spec", "machineName")
	var m kaironv1.Machine
	err := v.Reader.Get(ctx, client.ObjectKey{Namespace: mig.Namespace, Name: mig.Spec.MachineName}, &m)
	switch {
	case apierrors.IsNotFound(err):
		return nil, apierrors.NewInvalid(kaironv1.GroupVersion.WithKind("MachineMigration").GroupKind(), migrationName(mig),
			field.ErrorList{field.Invalid(machinePath, mig.Spec.MachineName,
				fmt.Sprintf("no Machine named %q exists in namespace %q; a MachineMigration moves an existing Machine of its own namespace",
					mig.Spec.MachineName, mig.Namespace))})
	case err != nil:
		return nil, apierrors.NewInternalError(fmt.Errorf("looking up machine %s/%s: %w", mig.Namespace, mig.Spec.MachineName, err))
	}
	states, err := rules.LoadBudgetStates(ctx, v.Reader)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	if ok, reason := rules.AdmitDisruption(states, &m); !ok {
		return nil, rules.NewDisruptionRefusal(&m, reason)
	}
	// After the budgets, so a refusal they would give stays their 429.
	var migrations kaironv1.MachineMigrationList
	if err := v.Reader.List(ctx, &migrations, client.InNamespace(mig.Namespace)); err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("listing machine migrations: %w", err))
	}
	if other := rules.ConflictingMigration(mig, migrations.Items); other != nil {
		return nil, apierrors.NewForbidden(kaironv1.GroupVersion.WithResource("machinemigrations").GroupResource(), migrationName(mig),
			fmt.Errorf("%s", rules.ConflictingMigrationMessage(mig.Spec.MachineName, other)))
	}
	return nil, nil
}

// ValidateUpdate allows every update: the spec is immutable (the API server
// enforces that), so an update never changes which Machine is disrupted.
func (v *MachineMigrationValidator) ValidateUpdate(context.Context, *kaironv1.MachineMigration, *kaironv1.MachineMigration) (admission.Warnings, error) {
	return nil, nil
}

// ValidateDelete allows every deletion.
func (v *MachineMigrationValidator) ValidateDelete(context.Context, *kaironv1.MachineMigration) (admission.Warnings, error) {
	return nil, nil
}

// migrationName names a migration in messages even when the API server has
// yet to generate its name.
func migrationName(mig *kaironv1.MachineMigration) string {
	if mig.Name == "" && mig.GenerateName != "" {
		return mig.GenerateName + "<generated>"
	}
	return mig.Name
}
