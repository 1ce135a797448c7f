package main

import (
	"fmt"
	"strings"
)

var compareHeader = []string{"scenario", "calls/s", "old", "change", "p50 ms", "old", "change", "p99 ms", "old", "change"}

// formatCompare lays out each scenario of this run (and then those only
// the old run has) beside the old run's figures, with the change in %.
func formatCompare(old, cur []result) string {
	byName := map[string]result{}
	for _, r := range old {
		if r.Skipped == "" {
			byName[r.Scenario] = r
		}
	}
	rows := [][]string{compareHeader}
	seen := map[string]bool{}
	for _, r := range cur {
		seen[r.Scenario] = true
		o, inOld := byName[r.Scenario]
		switch {
		case r.Skipped != "":
			rows = append(rows, []string{r.Scenario, "skipped", "", "", "", "", "", "", "", ""})
		case !inOld:
			rows = append(rows, []string{r.Scenario, num(r.CallsPerSec, 1), "-", "", num(r.P50Ms, 2), "-", "", num(r.P99Ms, 2), "-", ""})
		default:
			rows = append(rows, []string{r.Scenario,
				num(r.CallsPerSec, 1), num(o.CallsPerSec, 1), change(o.CallsPerSec, r.CallsPerSec),
				num(r.P50Ms, 2), num(o.P50Ms, 2), change(o.P50Ms, r.P50Ms),
				num(r.P99Ms, 2), num(o.P99Ms, 2), change(o.P99Ms, r.P99Ms)})
		}
	}
	for _, o := range old {
		if !seen[o.Scenario] && o.Skipped == "" {
			rows = append(rows, []string{o.Scenario, "-", num(o.CallsPerSec, 1), "", "-", num(o.P50Ms, 2), "", "-", num(o.P99Ms, 2), ""})
		}
	}
	return alignRows(rows)
}

func num(v float64, decimals int) string { return fmt.Sprintf("%.*f", decimals, v) }

// change is new relative to old in %, signed; empty when old is 0.
func change(old, cur float64) string {
	if old == 0 {
		return ""
	}
	return fmt.Sprintf("%+.1f%%", (cur-old)/old*100)
}

// alignRows lays rows out in columns separated by "|", the first row a
// header underlined, the first column left-aligned and the others right.
func alignRows(rows [][]string) string {
	width := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	line := func(row []string) {
		var l strings.Builder
		for i, c := range row {
			if i > 0 {
				l.WriteString(" | ")
			}
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if i == 0 {
				l.WriteString(c + pad)
			} else {
				l.WriteString(pad + c)
			}
		}
		b.WriteString(strings.TrimRight(l.String(), " ") + "\n")
	}
	line(rows[0])
	sep := make([]string, len(width))
	for i, w := range width {
		sep[i] = strings.Repeat("-", w)
	}
	b.WriteString(strings.Join(sep, "-|-") + "\n")
	for _, row := range rows[1:] {
		line(row)
	}
	return b.String()
}
