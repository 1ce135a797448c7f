package main

import "fmt"

// goal is a scenario's performance target: its text as the report shows it
// and the check of one run's result against it.
type goal struct {
	text string
	// check says whether r meets the goal and on which figures; ok false
	// means the run lacks what the check needs (why says what).
	check func(r result) (met bool, why string, ok bool)
}

// Thresholds of the goals.
const (
	goalCreateFloorShare = 0.60
	goalCreateP99Ms      = 50
	goalGetGinShare      = 0.40
	goalListP50Ms        = 15
	goalContentionPlaced = 8
	goalContentionP99Ms  = 200
	goalCapacityP50Ms    = 10
	goalAgents           = 10000
	goalAgentsCPUPercent = 100  // one core
	goalAgentsRSSMiB     = 1024 // 1 GiB
)

// goals are the targets the performance work set, per scenario; gin and
// activate have none (gin is a yardstick; activate is to be no slower than
// before, which -compare shows).
var goals = map[string]goal{
	"create": {
		text: fmt.Sprintf("≥ %.2f of the floor's tps, p99 ≤ %d ms", goalCreateFloorShare, goalCreateP99Ms),
		check: func(r result) (bool, string, bool) {
			if r.Floor == nil {
				return false, "no floor: " + orDefault(r.FloorSkipped, "not run"), false
			}
			return r.RatioThroughput >= goalCreateFloorShare && r.P99Ms <= goalCreateP99Ms,
				fmt.Sprintf("ratio tps %.2f, p99 %.2f ms", r.RatioThroughput, r.P99Ms), true
		},
	},
	"get": {
		text: fmt.Sprintf("≥ %.2f of the bare gin handler's calls/s", goalGetGinShare),
		check: func(r result) (bool, string, bool) {
			if r.RatioGin == 0 {
				return false, "no gin scenario in this run", false
			}
			return r.RatioGin >= goalGetGinShare, fmt.Sprintf("ratio gin tps %.2f", r.RatioGin), true
		},
	},
	"list": {
		text: fmt.Sprintf("p50 ≤ %d ms", goalListP50Ms),
		check: func(r result) (bool, string, bool) {
			return r.P50Ms <= goalListP50Ms, fmt.Sprintf("p50 %.2f ms", r.P50Ms), true
		},
	},
	"contention": {
		text: fmt.Sprintf("exactly %d placed, p99 ≤ %d ms", goalContentionPlaced, goalContentionP99Ms),
		check: func(r result) (bool, string, bool) {
			if r.Placed == nil {
				return false, "no placed count", false
			}
			return *r.Placed == goalContentionPlaced && r.P99Ms <= goalContentionP99Ms,
				fmt.Sprintf("%d placed, p99 %.2f ms", *r.Placed, r.P99Ms), true
		},
	},
	"capacity": {
		text: fmt.Sprintf("p50 ≤ %d ms", goalCapacityP50Ms),
		check: func(r result) (bool, string, bool) {
			return r.P50Ms <= goalCapacityP50Ms, fmt.Sprintf("p50 %.2f ms", r.P50Ms), true
		},
	},
	"agents": {
		text: fmt.Sprintf("%d agents connected at < %d%% of a core and < %d MiB RSS", goalAgents, goalAgentsCPUPercent, goalAgentsRSSMiB),
		check: func(r result) (bool, string, bool) {
			a := r.Agents
			if a == nil {
				return false, "agentload reported nothing", false
			}
			return a.ConnectedAtEnd >= goalAgents && a.APICPUAvg < goalAgentsCPUPercent && a.APIRSSMaxMiB < goalAgentsRSSMiB,
				fmt.Sprintf("%d of %d connected, %.1f%% of a core, %.0f MiB", a.ConnectedAtEnd, a.Agents, a.APICPUAvg, a.APIRSSMaxMiB), true
		},
	},
}

// evaluateGoals sets each result's goal and verdict. A run with failed
// calls misses its goal whatever its figures: they would be the errors'.
func evaluateGoals(results []result) {
	for i := range results {
		r := &results[i]
		g, ok := goals[r.Scenario]
		if !ok {
			continue
		}
		r.Goal, r.GoalMet, r.GoalNote = g.text, nil, ""
		if r.Skipped != "" {
			r.GoalNote = "skipped"
			continue
		}
		met, why, ok := g.check(*r)
		r.GoalNote = why
		if !ok {
			continue
		}
		if r.Errors > 0 {
			met, r.GoalNote = false, fmt.Sprintf("%s, %d failed calls", why, r.Errors)
		}
		r.GoalMet = &met
	}
}

// relate sets what one result is measured against another: get's ratio to
// gin.
func relate(results []result) {
	var get, gin *result
	for i := range results {
		switch r := &results[i]; {
		case r.Skipped != "":
		case r.Scenario == "get":
			get = r
		case r.Scenario == "gin":
			gin = r
		}
	}
	if get != nil && gin != nil && gin.CallsPerSec > 0 {
		get.RatioGin = get.CallsPerSec / gin.CallsPerSec
	}
}

// goalCell is the table's goal column: met, MISSED, ? (not evaluated) or -
// (no goal).
func goalCell(r result) string {
	switch {
	case r.Goal == "":
		return "-"
	case r.GoalMet == nil:
		return "?"
	case *r.GoalMet:
		return "met"
	default:
		return "MISSED"
	}
}

// goalVerdict is the notes' account of the goal.
func goalVerdict(r result) string {
	switch {
	case r.GoalMet == nil:
		return "not evaluated: " + r.GoalNote
	case *r.GoalMet:
		return "met (" + r.GoalNote + ")"
	default:
		return "missed (" + r.GoalNote + ")"
	}
}
