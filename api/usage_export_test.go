package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/better-compute/better-compute/api/projects"
	"github.com/better-compute/better-compute/api/usage"
	"github.com/better-compute/better-compute/core"
)

// A month's export, as JSON Lines and as CSV, holds every interval of the
// window clipped to it, and its units × microseconds sum, per class and
// model, to exactly what usage.list answers.
func TestUsageExportOfAMonthMatchesTheList(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.client(e.boot.UserToken)
	p, err := projects.Create.Call(ctx, a, projects.CreateInput{TenantID: "acme", Name: "train"})
	if err != nil {
		t.Fatal(err)
	}
	// 1,500 intervals over June 2025 and its edges, of odd lengths (to the
	// microsecond), three classes, two models, two projects, some open;
	// and another tenant's.
	if _, err := e.store.Pool.Exec(ctx, `INSERT INTO usage_intervals
		(reservation_id, tenant_id, project_id, pool_id, gpu_model, class, units, started_at, ended_at)
		SELECT 'rsv_' || g, 'acme', CASE WHEN g % 3 = 0 THEN $2 ELSE '' END, 'pool_1',
			(ARRAY['H100', 'L40S'])[1 + g % 2], (ARRAY['gpu', 'mig', 'slot'])[1 + g % 3], 1 + g % 8,
			$1::timestamptz - interval '2 days' + g * interval '31 minutes 7.123457 seconds',
			CASE WHEN g % 11 = 0 THEN NULL ELSE $1::timestamptz - interval '2 days' + g * interval '31 minutes 7.123457 seconds'
				+ (g % 97) * interval '13 minutes 1.000003 seconds' END
		FROM generate_series(1, 1500) g`, usageBase, p.ID); err != nil {
		t.Fatal(err)
	}
	e.meter("rsv_g", "globex", "", "gpu", "H100", 64, 0, 10)
	from, to := usageBase.UnixMilli(), usageBase.AddDate(0, 1, 0).UnixMilli()

	var jsonl bytes.Buffer
	rows, err := a.Stream(ctx, string(usage.Export), usage.ExportInput{TenantID: "acme", From: from, To: to}, &jsonl)
	if err != nil {
		t.Fatal(err)
	}
	type key struct{ class, model string }
	micros := map[key]int64{}
	n, jsonlBytes := 0, jsonl.Len()
	for sc := bufio.NewScanner(&jsonl); sc.Scan(); n++ {
		var it usage.Interval
		if err := json.Unmarshal(sc.Bytes(), &it); err != nil {
			t.Fatal(err)
		}
		if it.TenantID != "acme" || it.Start < from || it.End > to || it.End <= it.Start || it.Meter != it.Class+".hours" {
			t.Fatalf("line %d = %+v", n, it)
		}
		micros[key{it.Class, it.GPUModel}] += int64(it.Units) * it.Microseconds
	}
	if int64(n) != rows || n < 1000 {
		t.Fatalf("%d lines, the trailer says %d", n, rows)
	}
	list, err := usage.List.Call(ctx, a, usage.ListInput{TenantID: "acme", From: from, To: to})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != len(micros) {
		t.Fatalf("list %d groups, export %d", len(list.Items), len(micros))
	}
	var total float64
	for _, it := range list.Items {
		got := float64(micros[key{it.Class, it.GPUModel}]) / 3.6e9
		if got != it.UnitHours {
			t.Errorf("%s %s: export %v unit-hours, list %v", it.Class, it.GPUModel, got, it.UnitHours)
		}
		if it.Class == "gpu" {
			total += got
		}
	}
	if total != list.Total {
		t.Errorf("export GPU-hours %v, list total %v", total, list.Total)
	}

	// CSV: a header, then the same intervals.
	var text bytes.Buffer
	if _, err := a.Stream(ctx, string(usage.Export), usage.ExportInput{TenantID: "acme", From: from, To: to, Format: "csv"}, &text); err != nil {
		t.Fatal(err)
	}
	csvBytes := text.Len()
	records, err := csv.NewReader(&text).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(records) != n+1 || records[0][0] != "intervalId" || records[0][len(records[0])-1] != "quantity" {
		t.Fatalf("csv: %d records, header %v", len(records), records[0])
	}
	var csvMicros int64
	for _, r := range records[1:] {
		units, _ := strconv.ParseInt(r[9], 10, 64)
		us, _ := strconv.ParseInt(r[13], 10, 64)
		csvMicros += units * us
	}
	var all int64
	for _, v := range micros {
		all += v
	}
	if csvMicros != all {
		t.Fatalf("csv unit-microseconds %d, jsonl %d", csvMicros, all)
	}

	// One project's: decided on the project; another tenant is refused.
	var proj bytes.Buffer
	if _, err := a.Stream(ctx, string(usage.Export), usage.ExportInput{TenantID: "acme", ProjectID: p.ID, From: from, To: to}, &proj); err != nil {
		t.Fatal(err)
	}
	for sc := bufio.NewScanner(&proj); sc.Scan(); {
		var it usage.Interval
		if err := json.Unmarshal(sc.Bytes(), &it); err != nil || it.ProjectID != p.ID {
			t.Fatalf("project export line %s: %v", sc.Text(), err)
		}
	}
	if _, err := e.client(e.globex).Stream(ctx, string(usage.Export), usage.ExportInput{TenantID: "acme", From: from, To: to}, &bytes.Buffer{}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("globex exporting acme = %v, want ACCESS_DENIED", err)
	}
	if _, err := a.Stream(ctx, string(usage.Export), usage.ExportInput{TenantID: "acme", From: to, To: from}, &bytes.Buffer{}); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("an empty window = %v, want INVALID_INPUT", err)
	}
	t.Logf("%d intervals exported (%d bytes of JSON Lines, %d of CSV)", n, jsonlBytes, csvBytes)
}
