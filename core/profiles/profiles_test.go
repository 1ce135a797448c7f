package profiles_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/core/profiles"
	"github.com/better-compute/better-compute/core/provisioning"
)

// has says whether ps names field with reason.
func has(ps []provisioning.Problem, field, reason string) bool {
	return slices.ContainsFunc(ps, func(p provisioning.Problem) bool { return p.Field == field && p.Reason == reason })
}

func TestParseRefusals(t *testing.T) {
	cases := []struct {
		name, doc, field, reason string
	}{
		{"not json", `{`, "", "type"},
		{"no target", `{"image":{"name":"deb","version":"12"}}`, "target", "required"},
		{"bad target", `{"target":"cloud","image":{"name":"deb","version":"12"}}`, "target", "enum"},
		{"unknown field", `{"target":"metal","image":{"name":"deb","version":"12"},"colour":"red"}`, "colour", "unknown"},
		{"unknown nested", `{"target":"metal","image":{"name":"deb","version":"12"},"hostConfig":{"domain":"x"}}`, "hostConfig.domain", "unknown"},
		{"step unknown field", `{"target":"metal","image":{"id":"img_01jab3cdefghjkmnpqrstvwxyz"},"steps":[{"name":"a","on":"site","action":"power","extra":1}]}`, "steps[0].extra", "unknown"},
		{"step bad runner", `{"target":"metal","image":{"name":"deb","version":"12"},"steps":[{"name":"a","on":"cloud","action":"power"}]}`, "steps[0].on", "enum"},
		{"timeout too big", `{"target":"metal","image":{"name":"deb","version":"12"},"steps":[{"name":"a","on":"site","action":"power","timeoutSeconds":100000}]}`, "steps[0].timeoutSeconds", "range"},
		{"userData too long", `{"target":"metal","image":{"name":"deb","version":"12"},"userData":"` + strings.Repeat("x", 65537) + `"}`, "userData", "maxLength"},
		{"image without version", `{"target":"metal","image":{"name":"deb"}}`, "image.version", "required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, ps := profiles.Parse([]byte(c.doc))
			if !has(ps, c.field, c.reason) {
				t.Fatalf("problems = %+v; want %s %s", ps, c.field, c.reason)
			}
		})
	}
	d, ps := profiles.Parse([]byte(`{"target":"metal","image":{"name":"deb","version":"12"},"userData":"#cloud-config\n"}`))
	if len(ps) != 0 || d.Target != "metal" || d.Image.Name != "deb" || d.UserDataIsSecret() {
		t.Fatalf("parse = %+v, %+v", d, ps)
	}
}

func target() profiles.Target {
	return profiles.Target{Kind: "metal", Node: profiles.Node{ID: "node_1", Name: "gpu-7", PoolID: "pool_1", SiteID: "site_1",
		BootMAC: "52:54:00:12:34:56", Labels: map[string]string{"rack": "r12"},
		Disks:          []profiles.Disk{{Name: "vda", Serial: "S1", SizeBytes: 8 << 30, SizeGiB: 8}},
		NICs:           []profiles.NIC{{Name: "eth0", MAC: "52:54:00:12:34:56"}},
		DriverBindings: map[string]string{"power": "redfish/v1", "boot": "redfish/v1"}},
		Image: &provisioning.ImageRef{ID: "img_1", Name: "deb", Version: "12"}}
}

func TestTemplateFunctions(t *testing.T) {
	data, err := target().Data()
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{
		`{{ .node.name | upper }}`:                                 "GPU-7",
		`{{ "ABC" | lower }}`:                                      "abc",
		`{{ index .node.labels "zone" | default "z0" }}`:           "z0",
		`{{ index .node.labels "rack" | default "z0" }}`:           "r12",
		`{{ join "," (list) }}`:                                    "",
		`{{ .node.name | quote }}`:                                 `"gpu-7"`,
		`{{ .node.labels | toJson }}`:                              `{"rack":"r12"}`,
		`{{ "hi" | b64enc }}`:                                      "aGk=",
		`{{ indent 2 "a\nb" }}`:                                    "  a\n  b",
		`{{ (index .node.disks 0).sizeBytes }}`:                    "8589934592",
		`{{ .image.name }}-{{ .image.version }}`:                   "deb-12",
		`{{ replace "-" "." .node.name }}`:                         "gpu.7",
		`{{ trimPrefix "gpu-" .node.name }}`:                       "7",
		`plain text`:                                               "plain text",
		`{{ range .node.nics }}{{ .mac }}{{ end }}`:                "52:54:00:12:34:56",
		`{{ .node.name }}.{{ index .node.labels "rack" | lower }}`: "gpu-7.r12",
	}
	for text, want := range cases {
		if strings.Contains(text, "(list)") {
			// list is no function of the set: join refuses what is not a list.
			if _, err := profiles.Expand("t", `{{ join "," .node.name }}`, data); err == nil {
				t.Errorf("join of a string rendered")
			}
			continue
		}
		got, err := profiles.Expand("t", text, data)
		if err != nil || got != want {
			t.Errorf("%s = %q, %v; want %q", text, got, err, want)
		}
	}
	// A missing key fails, and so does a function outside the set.
	for _, text := range []string{`{{ .node.nmae }}`, `{{ .node.labels.zone }}`, `{{ env "HOME" }}`, `{{ readFile "/etc/passwd" }}`, `{{ .node.name`} {
		if got, err := profiles.Expand("t", text, data); err == nil {
			t.Errorf("%s = %q; want an error", text, got)
		}
	}
	// The output is bounded.
	big := `{{ range .node.nics }}` + strings.Repeat("x", profiles.MaxTemplateOutput+1) + `{{ end }}`
	if _, err := profiles.Expand("t", big, data); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("an oversized output = %v; want the bound", err)
	}
}

func TestRender(t *testing.T) {
	doc, ps := profiles.Parse([]byte(`{"target":"metal","image":{"name":"deb","version":"12"},
		"bindings":{"power":"redfish/v1"},
		"userData":"secret://acme/cloud-init",
		"hostConfig":{"hostname":"{{ .node.name }}.{{ index .node.labels \"rack\" }}","metaData":{"rack":"{{ index .node.labels \"rack\" }}"},"rootDevice":{"name":"vda"}},
		"steps":[
			{"name":"stage","on":"site","action":"stage-image"},
			{"name":"ramdisk","on":"site","action":"boot-ramdisk"},
			{"name":"write","on":"ramdisk","action":"write-image","args":{"rootDevice":"{{ (index .node.disks 0).name }}"}},
			{"name":"seed","on":"ramdisk","action":"write-seed"},
			{"name":"disk","on":"site","action":"set-boot-device","args":{"device":"disk"}},
			{"name":"reboot","on":"ramdisk","action":"reboot","await":"rejoin"},
			{"name":"hello","on":"node","action":"exec","args":{"argv":["echo","{{ .node.id }}"]},"retry":{"maxAttempts":3,"backoffSeconds":2}}],
		"acceptance":[{"kind":"minDisks","value":1}]}`))
	if len(ps) > 0 {
		t.Fatalf("parse: %+v", ps)
	}
	r, ps := profiles.Render(doc, target())
	if len(ps) > 0 {
		t.Fatalf("render: %+v", ps)
	}
	if r.Context.Hostname != "gpu-7.r12" || r.Context.MetaData["rack"] != "r12" || r.Context.UserDataSecret != "secret://acme/cloud-init" ||
		r.Context.UserData != "" || r.Context.Image.Name != "deb" || r.Context.RootDevice.Name != "vda" || len(r.Context.Acceptance) != 1 {
		t.Fatalf("context = %+v", r.Context)
	}
	if len(r.Steps) != 7 || r.Steps[2].Args["rootDevice"] != "vda" || r.Steps[6].Args["argv"].([]any)[1] != "node_1" ||
		r.Steps[6].Retry.MaxAttempts != 3 || r.Steps[0].TimeoutSeconds != 3600 || r.Steps[0].Retry.MaxAttempts != 3 {
		t.Fatalf("steps = %+v", r.Steps)
	}
	// The document was left alone.
	if doc.Steps[2].Args["rootDevice"] != "{{ (index .node.disks 0).name }}" {
		t.Fatalf("the document's args changed: %+v", doc.Steps[2].Args)
	}

	// No steps: the default metal steps.
	plain, _ := profiles.Parse([]byte(`{"target":"metal","image":{"name":"deb","version":"12"}}`))
	if r, ps := profiles.Render(plain, target()); len(ps) > 0 || len(r.Steps) != len(provisioning.DefaultMetalSteps()) {
		t.Fatalf("default steps = %+v, %+v", r.Steps, ps)
	}

	// Problems, each by its field.
	bad, ps := profiles.Parse([]byte(`{"target":"metal","image":{"name":"deb","version":"12"},
		"bindings":{"power":"ipmi/v1","boot":"nosuch"},
		"userData":"secret://acme",
		"hostConfig":{"hostname":"{{ .node.labels.zone }}","metaData":{"x":"{{ .node.name"}},
		"steps":[{"name":"w","on":"site","action":"power","args":{"action":"{{ index .node.labels \"rack\" }}"}}]}`))
	if len(ps) > 0 {
		t.Fatalf("parse: %+v", ps)
	}
	_, ps = profiles.Render(bad, target())
	for _, want := range [][2]string{
		{"bindings.power", profiles.ReasonBindingMismatch}, {"bindings.boot", profiles.ReasonBinding},
		{"userData", profiles.ReasonSecretRef}, {"hostConfig.hostname", profiles.ReasonTemplate},
		{"hostConfig.metaData.x", profiles.ReasonTemplate}, {"steps[0].args.action", provisioning.ReasonEnum},
	} {
		if !has(ps, want[0], want[1]) {
			t.Errorf("problems = %+v; want %s %s", ps, want[0], want[1])
		}
	}
	// Without a target, the templated argument's value is not judged.
	if ps := profiles.Check(bad); has(ps, "steps[0].args.action", provisioning.ReasonEnum) || !has(ps, "hostConfig.metaData.x", profiles.ReasonTemplate) {
		t.Errorf("check = %+v", ps)
	}
	// A profile for another kind of target.
	vps, _ := profiles.Parse([]byte(`{"target":"vps","image":{"name":"deb","version":"12"}}`))
	if _, ps := profiles.Render(vps, target()); !has(ps, "target", profiles.ReasonTargetMismatch) {
		t.Errorf("vps on metal = %+v", ps)
	}
	// A hostname that renders to no host name.
	h, _ := profiles.Parse([]byte(`{"target":"metal","image":{"name":"deb","version":"12"},"hostConfig":{"hostname":"{{ .node.name | upper }}"}}`))
	if _, ps := profiles.Render(h, target()); !has(ps, "hostConfig.hostname", provisioning.ReasonPattern) {
		t.Errorf("upper-case hostname = %+v", ps)
	}
}

func TestValidateSteps(t *testing.T) {
	st := func(name string, on provisioning.Runner, action string, args map[string]any) provisioning.Step {
		return provisioning.Step{Name: name, On: on, Action: action, Args: args}
	}
	ramdisk := st("rd", provisioning.RunnerSite, provisioning.ActionBootRamdisk, nil)
	reboot := st("reboot", provisioning.RunnerRamdisk, provisioning.ActionReboot, nil)
	reboot.Await = provisioning.AwaitRejoin
	many := make([]provisioning.Step, provisioning.MaxSteps+1)
	for i := range many {
		many[i] = st("s"+strings.Repeat("a", i%5)+string(rune('a'+i%26))+string(rune('a'+i/26)), provisioning.RunnerControlPlane, provisioning.ActionCheckImage, nil)
	}
	noAwait := reboot
	noAwait.Await = ""
	badAwait := st("p", provisioning.RunnerSite, provisioning.ActionStageImage, nil)
	badAwait.Await = provisioning.AwaitRejoin
	otherAwait := reboot
	otherAwait.Await = "forever"
	slow := st("slow", provisioning.RunnerControlPlane, provisioning.ActionCheckImage, nil)
	slow.TimeoutSeconds = 100000
	retries := st("r", provisioning.RunnerControlPlane, provisioning.ActionCheckImage, nil)
	retries.Retry = provisioning.Retry{MaxAttempts: 11, BackoffSeconds: 601}
	cases := []struct {
		name          string
		steps         []provisioning.Step
		field, reason string
	}{
		{"duplicate name", []provisioning.Step{st("a", provisioning.RunnerControlPlane, provisioning.ActionCheckImage, nil), st("a", provisioning.RunnerControlPlane, provisioning.ActionCheckImage, nil)}, "steps[1].name", provisioning.ReasonDuplicate},
		{"not a label", []provisioning.Step{st("Bad_Name", provisioning.RunnerControlPlane, provisioning.ActionCheckImage, nil)}, "steps[0].name", provisioning.ReasonPattern},
		{"no name", []provisioning.Step{st("", provisioning.RunnerControlPlane, provisioning.ActionCheckImage, nil)}, "steps[0].name", provisioning.ReasonRequired},
		{"unknown action", []provisioning.Step{st("a", provisioning.RunnerSite, "write-image", nil)}, "steps[0].action", provisioning.ReasonUnknownAction},
		{"unknown runner", []provisioning.Step{st("a", "cloud", "x", nil)}, "steps[0].on", provisioning.ReasonEnum},
		{"required arg", []provisioning.Step{st("a", provisioning.RunnerSite, provisioning.ActionPower, nil)}, "steps[0].args.action", provisioning.ReasonRequired},
		{"unknown arg", []provisioning.Step{st("a", provisioning.RunnerSite, provisioning.ActionPower, map[string]any{"action": "on", "force": true})}, "steps[0].args.force", provisioning.ReasonUnknownArg},
		{"enum arg", []provisioning.Step{st("a", provisioning.RunnerSite, provisioning.ActionSetBootDevice, map[string]any{"device": "floppy"})}, "steps[0].args.device", provisioning.ReasonEnum},
		{"seconds range", []provisioning.Step{st("a", provisioning.RunnerControlPlane, provisioning.ActionSleep, map[string]any{"seconds": 0.5})}, "steps[0].args.seconds", provisioning.ReasonRange},
		{"argv type", []provisioning.Step{ramdisk, st("x", provisioning.RunnerRamdisk, provisioning.ActionExec, map[string]any{"argv": "ls -l"})}, "steps[1].args.argv", provisioning.ReasonArgType},
		{"reboot without await", []provisioning.Step{ramdisk, noAwait}, "steps[1].await", provisioning.ReasonAwaitRequired},
		{"await on a step that keeps the boot", []provisioning.Step{badAwait}, "steps[0].await", provisioning.ReasonAwait},
		{"await other than rejoin", []provisioning.Step{ramdisk, otherAwait}, "steps[1].await", provisioning.ReasonEnum},
		{"ramdisk step first", []provisioning.Step{st("w", provisioning.RunnerRamdisk, provisioning.ActionWriteSeed, nil)}, "steps[0].on", provisioning.ReasonNeedsRamdisk},
		{"ramdisk step after a reboot", []provisioning.Step{ramdisk, reboot, st("w", provisioning.RunnerRamdisk, provisioning.ActionWriteSeed, nil)}, "steps[2].on", provisioning.ReasonNeedsRamdisk},
		{"node step before a rejoin", []provisioning.Step{st("n", provisioning.RunnerNode, provisioning.ActionExec, map[string]any{"argv": []string{"true"}})}, "steps[0].on", provisioning.ReasonNeedsRejoin},
		{"node step in the ramdisk", []provisioning.Step{ramdisk, st("n", provisioning.RunnerNode, provisioning.ActionExec, map[string]any{"argv": []string{"true"}})}, "steps[1].on", provisioning.ReasonNeedsRejoin},
		{"timeout bound", []provisioning.Step{slow}, "steps[0].timeoutSeconds", provisioning.ReasonRange},
		{"attempts bound", []provisioning.Step{retries}, "steps[0].retry.maxAttempts", provisioning.ReasonRange},
		{"backoff bound", []provisioning.Step{retries}, "steps[0].retry.backoffSeconds", provisioning.ReasonRange},
		{"too many steps", many, "steps", provisioning.ReasonMaxItems},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if ps := provisioning.ValidateSteps(c.steps); !has(ps, c.field, c.reason) {
				t.Fatalf("problems = %+v; want %s %s", ps, c.field, c.reason)
			}
		})
	}
	// The valid orders: the defaults, and a node step once the node re-joined.
	if ps := provisioning.ValidateSteps(provisioning.DefaultMetalSteps()); len(ps) > 0 {
		t.Fatalf("default steps: %+v", ps)
	}
	ok := append(provisioning.DefaultMetalSteps(), st("hello", provisioning.RunnerNode, provisioning.ActionExec, map[string]any{"argv": []any{"echo", "hi"}}),
		st("wait", provisioning.RunnerControlPlane, provisioning.ActionSleep, map[string]any{"seconds": 5}))
	if ps := provisioning.ValidateSteps(ok); len(ps) > 0 {
		t.Fatalf("valid steps: %+v", ps)
	}
}
