"""Prepare a fresh moto server for strata's tests: a user whose keys the tests use, and
the bucket `strata-test`. The server enforces IAM from its fourth request on
(INITIAL_NO_AUTH_ACTION_COUNT=3), so requests with other keys are refused as on S3.
Prints `ACCESS_KEY_ID SECRET_ACCESS_KEY`."""

import json
import sys

import boto3

endpoint, bucket = sys.argv[1], sys.argv[2]
anon = dict(endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
iam = boto3.client("iam", **anon)
iam.create_user(UserName="strata")  # request 1
key = iam.create_access_key(UserName="strata")["AccessKey"]  # request 2
iam.put_user_policy(  # request 3
    UserName="strata", PolicyName="all",
    PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id=key["AccessKeyId"],
                  aws_secret_access_key=key["SecretAccessKey"])
s3.create_bucket(Bucket=bucket)
print(key["AccessKeyId"], key["SecretAccessKey"])
