package nodes_test

import (
	"testing"

	"github.com/better-compute/better-compute/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
