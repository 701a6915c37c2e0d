"""Data: benchmark annotations, video decoding, sharding by video, EasyCom sessions and cached feature files, as
LightningDataModules."""
