DROP TABLE IF EXISTS {{.Failures}};
