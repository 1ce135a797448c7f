package api

import (
	"github.com/gin-gonic/gin"

	"github.com/better-compute/better-compute/api/httpx"
)

// writeError answers in the API's one error shape (httpx.WriteError).
func writeError(c *gin.Context, err error) { httpx.WriteError(c, err) }

// errorBody is the one error shape of the API (httpx.ErrorBody).
type errorBody = httpx.ErrorBody
