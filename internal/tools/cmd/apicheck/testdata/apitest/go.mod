module example.com/apitest

go 1.26.0
