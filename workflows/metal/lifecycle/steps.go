package lifecycle

import (
	"fmt"
	"slices"

	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/core"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/workflows/metal"
)

// purposeOf is the ramdisk boot purpose of an operation's boot step.
func purposeOf(op coremetal.Operation) string {
	switch op {
	case coremetal.Inspect:
		return activities.PurposeInspect
	case coremetal.Provide, coremetal.Undeploy:
		return activities.PurposeClean
	case coremetal.Deploy, coremetal.Retry:
		return activities.PurposeDeploy
	default:
		return activities.PurposeRescue
	}
}

// steps runs the operation's steps in order from the one the row records
// (a run the reconciler started again resumes there; the steps before it
// are done, and a boot among them is found again, not made twice), and
// answers the state the operation ends in.
func (l *lifecycle) steps(ctx workflow.Context) (nodes.ProvisionState, error) {
	final := l.edge.Target(l.lc.Origin)
	if l.lc.Operation == coremetal.Recover {
		final = activities.RecoveryTarget(l.lc.LastError)
	}
	l.bootID = l.lc.OpenBoot
	skip := max(slices.Index(l.edge.Steps, l.lc.Step), 0)
	cp := controlPlane(ctx)
	var a *activities.Metal
	for i, step := range l.edge.Steps {
		if l.aborting || l.expired {
			return "", workflow.ErrCanceled
		}
		if i < skip {
			if step == coremetal.StepBootRamdisk {
				if err := l.newBoot(ctx); err != nil {
					return "", err
				}
			}
			continue
		}
		l.step = step
		if err := workflow.ExecuteActivity(cp, a.SetStep, l.p, step).Get(cp, nil); err != nil {
			return "", err
		}
		if err := l.do(ctx, step); err != nil {
			return "", err
		}
	}
	return final, nil
}

// do runs one step.
func (l *lifecycle) do(ctx workflow.Context, step string) error {
	sctx := l.site(ctx)
	cp := controlPlane(ctx)
	var a *activities.Metal
	m := l.machine()
	switch step {
	case coremetal.StepVerifyBMC:
		var st metal.BMCStatus
		if err := workflow.ExecuteActivity(sctx, metal.ActivityVerifyBMC, m).Get(sctx, &st); err != nil {
			return err
		}
		l.power = st.Power
		return l.setPower(ctx, st.Power)
	case coremetal.StepPowerOff:
		if l.bootID != "" {
			return l.endBoot(ctx, true)
		}
		return l.powerAction(ctx, "off")
	case coremetal.StepPowerOn, coremetal.StepBootDisk:
		// The ramdisk boots set the boot device once, so with the media
		// ejected the machine comes up from its disk.
		return l.powerAction(ctx, "on")
	case coremetal.StepSetPower:
		action, err := activities.PowerAction(l.lc.OpArgs)
		if err != nil {
			return &stepError{code: string(core.CodeInvalidInput), reason: coremetal.ReasonStepFailed, message: err.Error()}
		}
		if err := l.powerAction(ctx, action); err != nil {
			return err
		}
		return l.setPower(ctx, l.power)
	case coremetal.StepInspectOOB:
		var oob metal.InspectOOBResult
		if err := workflow.ExecuteActivity(sctx, metal.ActivityInspectOOB, m).Get(sctx, &oob); err != nil {
			return err
		}
		if oob.Supported {
			workflow.GetLogger(ctx).Info("out-of-band inspection", "node", l.p.NodeID,
				"manufacturer", oob.Manufacturer, "model", oob.Model, "macs", len(oob.MACs))
		}
		return nil
	case coremetal.StepResetBIOS:
		return workflow.ExecuteActivity(sctx, metal.ActivityResetBIOS, m).Get(sctx, nil)
	case coremetal.StepBootRamdisk:
		if err := l.newBoot(ctx); err != nil {
			return err
		}
		var br metal.BootResult
		if err := workflow.ExecuteActivity(sctx, metal.ActivityBootRamdisk,
			metal.BootRequest{Machine: m, BootID: l.bootID, Purpose: purposeOf(l.lc.Operation)}).Get(sctx, &br); err != nil {
			return err
		}
		l.power = br.Power
		return nil
	case coremetal.StepAwaitRamdisk:
		return l.awaitBoot(ctx, func(p activities.BootProgress) bool { return p.Reported })
	case coremetal.StepWipeDisks:
		return l.awaitBoot(ctx, func(p activities.BootProgress) bool { return p.Done })
	case coremetal.StepIngestInventory:
		var in activities.Ingest
		if err := workflow.ExecuteActivity(cp, a.IngestInspection, l.p, l.bootID).Get(cp, &in); err != nil {
			return err
		}
		if in.ConflictNodeID != "" {
			return &stepError{code: string(core.CodeConflict), reason: coremetal.ReasonHardwareConflict,
				message: fmt.Sprintf("the inspected hardware key %s is already node %s's; nothing was merged", in.HardwareKey, in.ConflictNodeID)}
		}
		return nil
	case coremetal.StepAwaitRejoin:
		if err := l.awaitBoot(ctx, func(p activities.BootProgress) bool { return p.Reported }); err != nil {
			return err
		}
		var rj activities.Rejoin
		if err := workflow.ExecuteActivity(cp, a.CheckRejoin, l.p.TenantID, l.p.NodeID, l.bootID).Get(cp, &rj); err != nil {
			return err
		}
		if !rj.Match {
			return &stepError{code: string(core.CodeConflict), reason: coremetal.ReasonHardwareMismatch,
				message: fmt.Sprintf("the machine re-joined with hardware key %q, not the node's %q", rj.Got, rj.Want)}
		}
		// Deployed: the media goes, the machine stays on.
		return l.endBoot(ctx, false)
	case coremetal.StepEndBoot:
		return l.endBoot(ctx, false)
	case coremetal.StepProvision:
		return l.provision(ctx)
	case coremetal.StepRevokeIdentity:
		return workflow.ExecuteActivity(cp, a.RevokeIdentities, l.p).Get(cp, nil)
	default:
		return &stepError{code: string(core.CodeInternal), reason: coremetal.ReasonStepFailed,
			message: fmt.Sprintf("unknown step %q", step)}
	}
}

// newBoot creates (or finds again) the operation's boot.
func (l *lifecycle) newBoot(ctx workflow.Context) error {
	cp := controlPlane(ctx)
	var a *activities.Metal
	return workflow.ExecuteActivity(cp, a.NewBoot, l.p, purposeOf(l.lc.Operation)).Get(cp, &l.bootID)
}

// powerAction runs a power action on the site, read back.
func (l *lifecycle) powerAction(ctx workflow.Context, action string) error {
	sctx := l.site(ctx)
	var pr metal.PowerResult
	if err := workflow.ExecuteActivity(sctx, metal.ActivityPower, metal.PowerRequest{Machine: l.machine(), Action: action}).Get(sctx, &pr); err != nil {
		return err
	}
	l.power = pr.Power
	return nil
}

// endBoot ends the boot in flight (eject, stop serving it, power off when
// asked) and closes its row; with no boot it ejects whatever is inserted.
func (l *lifecycle) endBoot(ctx workflow.Context, powerOff bool) error {
	sctx := l.site(ctx)
	if err := workflow.ExecuteActivity(sctx, metal.ActivityEndBoot,
		metal.EndBootRequest{Machine: l.machine(), BootID: l.bootID, PowerOff: powerOff}).Get(sctx, nil); err != nil {
		return err
	}
	if powerOff {
		l.power = string(nodes.PowerOff)
	}
	if l.bootID == "" {
		return nil
	}
	return l.closeBoot(ctx, l.bootID)
}

func (l *lifecycle) closeBoot(ctx workflow.Context, bootID string) error {
	cp := controlPlane(ctx)
	var a *activities.Metal
	if err := workflow.ExecuteActivity(cp, a.CloseBoot, l.p.TenantID, bootID).Get(cp, nil); err != nil {
		return err
	}
	if l.bootID == bootID {
		l.bootID = ""
	}
	return nil
}

// setPower records a power read-back on the node.
func (l *lifecycle) setPower(ctx workflow.Context, power string) error {
	if power == "" {
		return nil
	}
	cp := controlPlane(ctx)
	var a *activities.Metal
	return workflow.ExecuteActivity(cp, a.RecordPower, l.p.TenantID, l.p.NodeID, activities.NormalPower(power)).Get(cp, nil)
}

// awaitBoot waits until the boot's progress satisfies done: it reads the
// boot row, and waits for the boot-reported signal or the next poll. A
// ramdisk step that failed fails the step.
func (l *lifecycle) awaitBoot(ctx workflow.Context, done func(activities.BootProgress) bool) error {
	cp := controlPlane(ctx)
	var a *activities.Metal
	purpose := purposeOf(l.lc.Operation)
	for {
		l.signalled = false
		var bp activities.BootProgress
		if err := workflow.ExecuteActivity(cp, a.BootProgress, l.p.TenantID, l.bootID, purpose).Get(cp, &bp); err != nil {
			return err
		}
		if bp.Failed != "" {
			return &stepError{code: string(core.CodeInternal), reason: coremetal.ReasonStepFailed, message: bp.Failed}
		}
		if done(bp) {
			return nil
		}
		if _, err := workflow.AwaitWithOptions(ctx, workflow.AwaitOptions{Timeout: BootPoll,
			TimerOptions: workflow.TimerOptions{Summary: "await ramdisk"}},
			func() bool { return l.signalled }); err != nil {
			return err
		}
	}
}
