module example.invalid/pause

go 1.26.0
